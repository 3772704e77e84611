"""What HF accelerate's ``Accelerator`` has and ours does not offer, said where it is reached.

Each absent member raises a ``NotImplementedError`` naming it and what to use instead — never an ``AttributeError``
deep in a training loop. ``ABSENT_MEMBERS`` is also the table the parity page and its test read
(``tests/test_accelerate_parity.py`` fails when HF grows a public member that is neither ours nor listed here).
"""
from __future__ import annotations

from typing import Any, Dict, NoReturn

__all__ = ["ABSENT_MEMBERS", "ABSENT_PARAMETERS", "AbsentMembers", "refuse", "refuse_name"]

_NO_MODEL_PARALLEL = ("tensor, context and pipeline parallelism (and HF's ParallelismConfig device meshes) are not "
                      "offered: shard the model with FSDP2 (fsdp_plugin=FullyShardedDataParallelPlugin()) or DeepSpeed "
                      "ZeRO-3, and use process_index / num_processes for the data-parallel rank")  # fmt: skip

# member -> (kind, why it is absent and what to use instead)
ABSENT_MEMBERS: Dict[str, str] = {
    "tensor_parallel_rank": _NO_MODEL_PARALLEL,
    "pipeline_parallel_rank": _NO_MODEL_PARALLEL,
    "context_parallel_rank": _NO_MODEL_PARALLEL,
    "data_parallel_rank": _NO_MODEL_PARALLEL,
    "data_parallel_shard_rank": _NO_MODEL_PARALLEL,
    "maybe_context_parallel": _NO_MODEL_PARALLEL,
    "deepspeed_ulysses_dl_adapter": "DeepSpeed-Ulysses sequence parallelism is not offered: " + _NO_MODEL_PARALLEL,
    "lomo_backward": "LOMO optimizers are not offered: use accelerator.backward(loss) and a torch.optim optimizer",
}

# constructor parameter -> why (each refused when given, and only then)
ABSENT_PARAMETERS: Dict[str, str] = {
    "megatron_lm_plugin": "Megatron-LM is not offered: shard the model with FSDP2 (fsdp_plugin=...) or DeepSpeed "
                          "ZeRO-3 (deepspeed_plugin=...)",
    "torch_tp_plugin": _NO_MODEL_PARALLEL,
    "parallelism_config": _NO_MODEL_PARALLEL,
    "deepspeed_plugins": "several DeepSpeed plugins at once (a dict of them, for several models) are not offered: pass "
                         "one DeepSpeedPlugin as deepspeed_plugin=",
    "mixed_precision='fp8'": "fp8 training (TransformerEngine, torchao, MS-AMP) is not offered: use "
                             "mixed_precision='bf16' (or 'fp16' on CUDA)",
}


def refuse(name: str, why: str) -> NoReturn:
    raise NotImplementedError(f"Accelerator.{name} is not offered by notebook_accel's Accelerator: {why}. "
                              "(HF accelerate's own Accelerator also runs under notebook_launcher.)")


def refuse_name(name: str, why: str) -> NoReturn:
    """:func:`refuse` for a name outside the Accelerator (a function, a class, a parameter of one)."""
    raise NotImplementedError(f"{name} is not offered by notebook_accel: {why}. (HF accelerate's own also runs "
                              "under notebook_launcher.)")


def _absent_property(name: str) -> property:
    def get(self: Any) -> Any:
        refuse(name, ABSENT_MEMBERS[name])

    get.__doc__ = f"Absent: {ABSENT_MEMBERS[name]}."
    return property(get)


def _absent_method(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        refuse(name, ABSENT_MEMBERS[name])

    method.__name__ = name
    method.__doc__ = f"Absent: {ABSENT_MEMBERS[name]}."
    return method


class AbsentMembers:
    """Mixed into the Accelerator: one member per entry of ``ABSENT_MEMBERS``, each raising NotImplementedError."""

    tensor_parallel_rank = _absent_property("tensor_parallel_rank")
    pipeline_parallel_rank = _absent_property("pipeline_parallel_rank")
    context_parallel_rank = _absent_property("context_parallel_rank")
    data_parallel_rank = _absent_property("data_parallel_rank")
    data_parallel_shard_rank = _absent_property("data_parallel_shard_rank")
    maybe_context_parallel = _absent_method("maybe_context_parallel")
    deepspeed_ulysses_dl_adapter = _absent_method("deepspeed_ulysses_dl_adapter")
    lomo_backward = _absent_method("lomo_backward")
