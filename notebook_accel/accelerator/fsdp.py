"""FSDP2 through the Accelerator: ``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())``.

Each rank keeps 1/N of every parameter, gradient and optimizer state (``torch.distributed.fsdp.fully_shard``
on a 1-D device mesh: the composable FSDP2, not the legacy FSDP1 wrapper). The plugin takes HF accelerate's
names, so code ports by changing the import; the environment HF accelerate's own launcher sets
(``ACCELERATE_USE_FSDP``, ``FSDP_*``) builds the same plugin when ``Accelerator()`` is given none.

What is sharded: every module the wrap policy picks (transformer blocks by class name, or submodules of at
least ``min_num_params`` parameters), then the root. A block is the unit FSDP gathers before its forward and
frees after it, so blocks bound the peak memory; the root alone still shards, but gathers the whole model.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch

__all__ = ["FullyShardedDataParallelPlugin", "shard_model", "is_sharded", "full_state_dict", "canonical_name"]

WrapPolicy = Union[str, Callable[[torch.nn.Module], bool], None]
_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


def _names(value: Union[str, Sequence[str], None]) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):  # accelerate's env and YAML spell a list as "A,B"
        return [name.strip() for name in value.split(",") if name.strip()]
    return [name if isinstance(name, str) else name.__name__ for name in value]


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    value = environ.get(name, "").strip().lower()
    return default if not value else value in ("1", "true", "yes", "on")


@dataclasses.dataclass
class FullyShardedDataParallelPlugin:
    """How to shard a model with FSDP2 (HF accelerate's field names; ``transformer_layer_cls_to_wrap`` is the
    HF Trainer's spelling of ``transformer_cls_names_to_wrap``).

    Args:
        auto_wrap_policy: "transformer_based_wrap" (shard each block whose class name is listed),
            "size_based_wrap" (each submodule of at least ``min_num_params`` parameters), "no_wrap" (the root
            only), or a function ``module -> bool``. Default: transformer-based when class names are given,
            size-based when ``min_num_params`` is, else the root only.
        transformer_cls_names_to_wrap: block class names (or classes), e.g. ``["TransformerEncoderLayer"]``.
        min_num_params: the size-based threshold.
        reshard_after_forward: free gathered parameters after each block's forward (less memory, one more
            all-gather in backward); False keeps them until backward (ZeRO-2-like).
        cpu_offload: keep sharded parameters, gradients and optimizer state in host memory (CUDA only; on the
            CPU they are there already).
        activation_checkpointing: recompute each wrapped block's activations in backward.
        mixed_precision_policy: a ``torch.distributed.fsdp.MixedPrecisionPolicy`` or its fields as a dict
            (dtypes as torch dtypes or "bf16"/"fp16"/"fp32"); default: from the Accelerator's
            ``mixed_precision`` (parameters in bf16/fp16 for compute, gradients reduced in fp32).
        state_dict_type: "SHARDED_STATE_DICT" (``save_state`` writes each rank's shards with
            torch.distributed.checkpoint, loadable on any number of ranks) — the only one supported.
        state_dict_config: FSDP1's (``FullStateDictConfig``...), accepted so that HF's code runs:
            ``get_state_dict`` gives the full weights in any case, ``save_state`` writes shards.
        optim_state_dict_config: likewise, for the optimizer's state.

    HF's other fields are there by HF's names and defaults: FSDP1's ``sharding_strategy`` maps to
    ``reshard_after_forward``; ``limit_all_gathers``, ``use_orig_params``, ``sync_module_states`` and
    ``cpu_ram_efficient_loading`` are what FSDP2 here does anyway; ``backward_prefetch``, ``forward_prefetch``,
    ``ignored_modules``, ``param_init_fn`` and ``activation_checkpointing_offload`` are refused by name.
    """

    # HF's fields, in HF's order and with HF's None defaults (None: ours, below); our spelling last
    fsdp_version: Optional[int] = None  # 2 (FSDP2, the only one here)
    sharding_strategy: Any = None  # FSDP1's: "FULL_SHARD" -> reshard_after_forward, "SHARD_GRAD_OP" -> not
    reshard_after_forward: Optional[bool] = None  # True
    backward_prefetch: Any = None  # FSDP1's: refused (FSDP2 prefetches by itself)
    mixed_precision_policy: Any = None
    auto_wrap_policy: WrapPolicy = None
    cpu_offload: Optional[bool] = None  # False
    ignored_modules: Any = None  # refused
    state_dict_type: Optional[str] = None  # "SHARDED_STATE_DICT"
    state_dict_config: Any = None  # FSDP1's configs: accepted (see the class docstring)
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True  # FSDP1's rate limiter: FSDP2 has none to turn off
    use_orig_params: Optional[bool] = None  # FSDP2 always keeps the original parameters
    param_init_fn: Any = None  # refused: init_module / init_empty_weights materialize the shards
    sync_module_states: Optional[bool] = None  # FSDP2 shards rank 0's weights (sync) in any case
    forward_prefetch: Optional[bool] = None  # refused when True
    activation_checkpointing: Optional[bool] = None  # False
    activation_checkpointing_offload: Optional[bool] = None  # refused when True
    cpu_ram_efficient_loading: Optional[bool] = None  # init_module builds the shards only, in any case
    transformer_cls_names_to_wrap: Union[str, Sequence[Any], None] = None
    min_num_params: Optional[int] = None  # 0
    transformer_layer_cls_to_wrap: Union[str, Sequence[Any], None] = None

    def __post_init__(self) -> None:
        self._resolve_hf_fields()
        if self.fsdp_version != 2:
            raise ValueError(
                f"fsdp_version={self.fsdp_version}: notebook_accel shards with FSDP2 (fully_shard) only; the "
                "legacy FSDP1 wrapper is not supported. Drop fsdp_version (2 is the default)."
            )
        names = _names(self.transformer_cls_names_to_wrap) + _names(self.transformer_layer_cls_to_wrap)
        self.transformer_cls_names_to_wrap = list(dict.fromkeys(names))
        self.transformer_layer_cls_to_wrap = None
        if self.auto_wrap_policy is None:
            if self.transformer_cls_names_to_wrap:
                self.auto_wrap_policy = "transformer_based_wrap"
            elif self.min_num_params > 0:
                self.auto_wrap_policy = "size_based_wrap"
            else:
                self.auto_wrap_policy = "no_wrap"
        policy = self.auto_wrap_policy
        if isinstance(policy, str):
            policy = policy.strip().lower().replace("-", "_")
            policy = {"transformer": "transformer_based_wrap", "size": "size_based_wrap", "none": "no_wrap"}.get(
                policy, policy)
            if policy not in _POLICIES:
                raise ValueError(f"auto_wrap_policy={self.auto_wrap_policy!r}: use one of {', '.join(_POLICIES)}, "
                                 "or a function module -> bool")
            if policy == "transformer_based_wrap" and not self.transformer_cls_names_to_wrap:
                raise ValueError("auto_wrap_policy='transformer_based_wrap' needs transformer_cls_names_to_wrap, "
                                 "e.g. ['TransformerEncoderLayer'] (the class name of your model's blocks)")
            if policy == "size_based_wrap" and self.min_num_params <= 0:
                raise ValueError("auto_wrap_policy='size_based_wrap' needs min_num_params > 0")
            self.auto_wrap_policy = policy
        elif not callable(policy):
            raise TypeError(f"auto_wrap_policy must be a policy name or a function, not {type(policy).__name__}")
        if str(self.state_dict_type).upper() != "SHARDED_STATE_DICT":
            raise ValueError(
                f"state_dict_type={self.state_dict_type!r}: save_state writes sharded checkpoints "
                "(SHARDED_STATE_DICT) only; for one file of full weights use accelerator.get_state_dict(model) "
                "on every rank and save rank 0's."
            )

    def _resolve_hf_fields(self) -> None:
        """HF's None defaults to ours; FSDP1's fields to FSDP2's, or refused by name where FSDP2 has no such thing."""
        from .absent import refuse_name

        for name, ours in (("fsdp_version", 2), ("cpu_offload", False), ("activation_checkpointing", False),
                           ("state_dict_type", "SHARDED_STATE_DICT"), ("min_num_params", 0)):  # fmt: skip
            if getattr(self, name) is None:
                setattr(self, name, ours)
        strategy = self.sharding_strategy
        if strategy is not None:
            strategy = str(getattr(strategy, "name", strategy)).upper()
            strategy = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP"}.get(strategy, strategy)
            if strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
                refuse_name(f"FullyShardedDataParallelPlugin(sharding_strategy={strategy!r})", "FSDP2 shards fully "
                            "(FULL_SHARD) or keeps gathered parameters until backward (SHARD_GRAD_OP): use "
                            "reshard_after_forward=True / False; for replication use DDP (no fsdp_plugin)")  # fmt: skip
            if self.reshard_after_forward is None:
                self.reshard_after_forward = strategy == "FULL_SHARD"
        if self.reshard_after_forward is None:
            self.reshard_after_forward = True
        refused = {"backward_prefetch": "FSDP2 prefetches the next block's all-gather by itself",
                   "ignored_modules": "every parameter of a prepared model is sharded here",
                   "param_init_fn": "build the model under accelerator.init_module() (or init_empty_weights) and "
                                    "prepare() materializes each rank's shards",
                   "forward_prefetch": "FSDP2 prefetches by itself", "activation_checkpointing_offload":
                   "activation_checkpointing=True recomputes activations; offloading them is not offered"}
        for name, why in refused.items():
            if getattr(self, name):
                refuse_name(f"FullyShardedDataParallelPlugin({name}=...)", why)

    @classmethod
    def from_environment(
        cls, environ: Optional[Mapping[str, str]] = None
    ) -> Optional["FullyShardedDataParallelPlugin"]:
        """The plugin HF accelerate's launcher describes in the environment, or None without ACCELERATE_USE_FSDP."""
        environ = os.environ if environ is None else environ
        if not _flag(environ, "ACCELERATE_USE_FSDP", False):
            return None
        policy = environ.get("FSDP_AUTO_WRAP_POLICY", "").strip()
        return cls(
            fsdp_version=int(environ.get("FSDP_VERSION", "2") or 2),
            auto_wrap_policy=(policy.lower() or None) if policy.upper() != "NO_WRAP" else "no_wrap",
            transformer_cls_names_to_wrap=environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP") or None,
            min_num_params=int(environ.get("FSDP_MIN_NUM_PARAMS", "0") or 0),
            reshard_after_forward=_flag(environ, "FSDP_RESHARD_AFTER_FORWARD", True),
            cpu_offload=_flag(environ, "FSDP_OFFLOAD_PARAMS", False),
            activation_checkpointing=_flag(environ, "FSDP_ACTIVATION_CHECKPOINTING", False),
        )


def is_sharded(model: Any) -> bool:
    """True for a module that ``fully_shard`` has sharded (FSDP2)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def _blocks(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin) -> List[torch.nn.Module]:
    """The submodules to shard on their own, children before parents (FSDP2 wants inner ones first)."""
    policy = plugin.auto_wrap_policy
    if policy == "no_wrap":
        return []
    if policy == "transformer_based_wrap":
        wanted = set(plugin.transformer_cls_names_to_wrap or ())
        found = {type(module).__name__ for module in model.modules()}
        missing = wanted - found
        if missing == wanted:
            raise ValueError(
                f"transformer_cls_names_to_wrap={sorted(wanted)}: the model has no module of "
                f"{'that class' if len(wanted) == 1 else 'those classes'}; its classes are "
                f"{', '.join(sorted(found))}"
            )
        picked = [module for module in model.modules() if type(module).__name__ in wanted and module is not model]
        return list(reversed(picked))
    if callable(policy):
        return list(reversed([module for module in model.modules() if module is not model and policy(module)]))
    # size-based: bottom-up, a submodule holding min_num_params parameters not already in a picked block
    picked: List[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> int:
        count = sum(param.numel() for param in module.parameters(recurse=False))
        count += sum(visit(child) for child in module.children())
        if module is not model and count >= plugin.min_num_params:
            picked.append(module)
            return 0
        return count

    visit(model)
    return picked


def _mixed_precision_policy(plugin: FullyShardedDataParallelPlugin, mixed_precision: str) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    given = plugin.mixed_precision_policy
    if isinstance(given, MixedPrecisionPolicy):
        return given
    if isinstance(given, dict):
        fields = {key: _DTYPES.get(value, value) if isinstance(value, str) else value for key, value in given.items()}
        return MixedPrecisionPolicy(**fields)
    if mixed_precision in ("bf16", "fp16"):
        # compute in low precision, reduce gradients and keep the sharded master weights in fp32
        return MixedPrecisionPolicy(param_dtype=_DTYPES[mixed_precision], reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def canonical_name(name: str) -> str:
    # activation checkpointing wraps a block; its parameters' names gain this segment (state_dict hides it)
    return name.replace("_checkpoint_wrapped_module.", "")


def shard_model(
    model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, device: torch.device, world: int,
    mixed_precision: str, rows: Optional[Dict[str, Optional[torch.Tensor]]] = None,
) -> Dict[torch.nn.Parameter, torch.nn.Parameter]:
    """Shard ``model`` in place over ``world`` ranks; returns old parameter -> new (sharded) parameter.

    ``fully_shard`` registers new parameters (DTensors), so an optimizer built on the model before
    ``prepare`` must be pointed at them (see ``optimizer.switch_parameters``). A model built under
    ``init_module`` has its parameters on the meta device and comes with ``rows``, this rank's recorded part of
    each (see :mod:`.sharded_init`): it is sharded as it is, then its shards are allocated and filled.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    before = {name: param for name, param in model.named_parameters()}
    blocks = _blocks(model, plugin)
    if plugin.activation_checkpointing:
        if not blocks:
            raise ValueError(
                "activation_checkpointing=True recomputes each wrapped block in backward, but no block is "
                "wrapped: give transformer_cls_names_to_wrap (or min_num_params)"
            )
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        chosen = {id(block) for block in blocks}
        apply_activation_checkpointing(model, check_fn=lambda module: id(module) in chosen)
    mesh = init_device_mesh(device.type, (world,))
    offload = plugin.cpu_offload and device.type != "cpu"
    options = dict(
        mesh=mesh,
        reshard_after_forward=plugin.reshard_after_forward,
        mp_policy=_mixed_precision_policy(plugin, mixed_precision),
        offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy(),
    )
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    if rows is not None:
        _fill_shards(model, rows, torch.device("cpu") if offload else device)
    after = {canonical_name(name): param for name, param in model.named_parameters()}
    return {param: after[name] for name, param in before.items() if name in after and after[name] is not param}


def _fill_shards(model: torch.nn.Module, rows: Dict[str, Optional[torch.Tensor]], device: torch.device) -> None:
    """Give a model sharded on the meta device its shards: this rank's recorded ``rows`` of each parameter
    become its local shard (moved to ``device``; uninitialised where none were recorded), one parameter at a time,
    as ``load_state_dict(assign=True)`` — which FSDP2 supports — so no second copy is made. Its buffers are real
    all along (``fully_shard`` moved them to the device)."""
    from torch.distributed.tensor import DTensor

    shards: Dict[int, torch.nn.Parameter] = {}
    state: Dict[str, torch.nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):  # tied parameters: one shard, every name
        if id(param) not in shards:
            values = rows.pop(canonical_name(name), None)
            local = (torch.empty(param.to_local().shape, dtype=param.dtype, device=device) if values is None
                     else values.to(device))  # fmt: skip
            if local.shape != param.to_local().shape:
                raise RuntimeError(f"init_module: the shard of {name} is {tuple(param.to_local().shape)} but "
                                   f"{tuple(local.shape)} was recorded (FSDP2 cuts dim 0 as torch.chunk does)")
            sharded = DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape,
                                         stride=param.stride())  # fmt: skip
            shards[id(param)] = torch.nn.Parameter(sharded, requires_grad=param.requires_grad)
        state[canonical_name(name)] = shards[id(param)]
    model.load_state_dict(state, strict=False, assign=True)


def full_state_dict(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The whole model's weights as CPU tensors on rank 0 (gathered from every rank's shards; call it on every
    rank); the other ranks get an empty dict, as with HF accelerate."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
