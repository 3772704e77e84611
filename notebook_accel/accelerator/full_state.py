"""Full (unsharded) weights and optimizer state, keyed by parameter name, into any prepared model.

The bridge between checkpoints written on one number of ranks and models prepared on another: a plain
checkpoint (one process, DDP) holds full state already, a DeepSpeed checkpoint is merged into it
(:mod:`.zero_checkpoint`); this module writes it into a plain module, an FSDP2-sharded one (each rank keeps
its shards) or a DeepSpeed engine (each rank keeps its partitions).

The optimizer state's form is torch.distributed.checkpoint's ``get_optimizer_state_dict(full_state_dict=True)``::

    {"state": {"0.weight": {"momentum_buffer": tensor, ...}, ...},
     "param_groups": [{"lr": 0.1, ..., "params": ["0.weight", "0.bias", ...]}, ...]}

A torch optimizer's own ``state_dict()`` keys parameters by position instead; :func:`named_optimizer_state`
names them, from the ``param_names`` each group carries in our checkpoints (torch's own key, which it writes
for optimizers built from ``named_parameters()``) or from the optimizer the state is loaded into.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from .fsdp import canonical_name
from .zero import is_engine

__all__ = [
    "torch_optimizer",
    "optimizer_parameter_names",
    "named_optimizer_state",
    "with_parameter_names",
    "without_parameter_names",
    "load_full_weights",
    "load_full_optimizer_state",
]

NamedOptimizerState = Dict[str, Any]


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The user's torch optimizer inside a prepared one."""
    return getattr(optimizer, "optimizer", optimizer)  # an AcceleratedOptimizer wraps the user's


# ------------------------------------------------------------------------------ naming a torch optimizer's state
def optimizer_parameter_names(optimizer: Any, model: torch.nn.Module) -> Optional[List[List[str]]]:
    """Each param group's parameter names in ``model``, in the optimizer's order; None if one is not the
    model's (a DeepSpeed engine's optimizer, for one, holds flat partitions instead)."""
    names = {id(param): canonical_name(name) for name, param in model.named_parameters()}
    groups = [[names.get(id(param)) for param in group["params"]] for group in torch_optimizer(optimizer).param_groups]
    if not any(groups) or any(name is None for group in groups for name in group):
        return None
    return groups  # type: ignore[return-value]


def with_parameter_names(state_dict: Dict[str, Any], names: Optional[Sequence[Sequence[str]]]) -> Dict[str, Any]:
    """A torch optimizer ``state_dict()`` whose groups carry ``param_names`` (unless they do already)."""
    if names is None or any("param_names" in group for group in state_dict["param_groups"]):
        return state_dict
    groups = [{**group, "param_names": list(group_names)}
              for group, group_names in zip(state_dict["param_groups"], names)]  # fmt: skip
    return {**state_dict, "param_groups": groups}


def without_parameter_names(state_dict: Dict[str, Any], optimizer: Any) -> Dict[str, Any]:
    """What ``optimizer.load_state_dict`` should get: our ``param_names`` dropped where the optimizer has none
    (torch would copy them into its groups, and then refuse a later ``add_param_group`` without them)."""
    if any("param_names" in group for group in torch_optimizer(optimizer).param_groups):
        return state_dict
    groups = [{key: value for key, value in group.items() if key != "param_names"}
              for group in state_dict["param_groups"]]  # fmt: skip
    return {**state_dict, "param_groups": groups}


def named_optimizer_state(state_dict: Dict[str, Any], names: Optional[List[List[str]]]) -> NamedOptimizerState:
    """A torch optimizer ``state_dict()`` (parameters by position) keyed by parameter name instead: the names
    its groups carry, else ``names`` (those of the optimizer it is loaded into, in the same order)."""
    by_position: Dict[int, str] = {}
    groups = []
    for index, group in enumerate(state_dict["param_groups"]):
        group_names = group.get("param_names") or (names[index] if names is not None and index < len(names) else None)
        if group_names is None or len(group_names) != len(group["params"]):
            raise ValueError(
                "the checkpoint's optimizer state does not name its parameters, and the optimizer it is loaded "
                "into cannot name them either: prepare the same model and optimizer as when saving"
            )
        by_position.update(zip(group["params"], group_names))
        hyper = {key: value for key, value in group.items() if key not in ("params", "param_names")}
        groups.append({**hyper, "params": list(group_names)})
    return {"state": {by_position[position]: state for position, state in state_dict["state"].items()},
            "param_groups": groups}  # fmt: skip


# ----------------------------------------------------------------------------------- writing it into a model
def load_full_weights(model: torch.nn.Module, weights: Optional[Dict[str, torch.Tensor]], from_rank0: bool = False,
                      strict: bool = True) -> None:
    """Full ``weights`` into a prepared ``model``: plain, FSDP2-sharded (torch.distributed.checkpoint's
    full-state setter cuts this rank's shards) or a DeepSpeed engine. Every rank calls it: with the same
    ``weights``, or, ``from_rank0``, with them on rank 0 only (None elsewhere) — rank 0 then sends them one tensor
    at a time and each rank keeps its part, so no other rank ever holds the whole model."""
    if is_engine(model):
        _weights_into_engine(model, weights, from_rank0)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=from_rank0, strict=strict)
    set_model_state_dict(model, weights or {}, options=options)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: Any, state: NamedOptimizerState) -> bool:
    """A name-keyed full optimizer ``state`` into ``optimizer``, which updates the prepared ``model``'s
    parameters (plain, FSDP2-sharded, or a ZeRO-3 engine's). Every rank calls it with the same. False where it
    cannot (a ZeRO-1/2 engine): the optimizer is left as it is."""
    if is_engine(model):
        return _optimizer_state_into_engine(model, state)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # torch's full-state setter cuts each state tensor into this rank's shard, on the device of the optimizer's
    # own tensors; an optimizer without any (plain SGD, or one saved before its first step) has none to tell it,
    # and it asserts "Expected device to be set". Such a state has nothing to cut: it loads as it is.
    full = _holds_parameter_tensors(state)
    set_optimizer_state_dict(model, torch_optimizer(optimizer), state, options=StateDictOptions(full_state_dict=full))
    return True


def _holds_parameter_tensors(state: NamedOptimizerState) -> bool:
    """Whether a name-keyed optimizer state has a tensor per parameter (momentum, Adam's moments), not only
    scalars (a step count)."""
    return any(torch.is_tensor(value) and value.dim() > 0
               for entries in state["state"].values() for value in entries.values())  # fmt: skip


# A DeepSpeed engine. The working weights (16-bit under bf16/fp16) are written whole and partitioned again by
# GatheredParameters under ZeRO-3 (a no-op below it); the fp32 master weights and each optimizer state tensor go
# through DeepSpeed's tensor-fragment API: under ZeRO-3 its local setters take this rank's slice of the padded
# flat value (the full setters would index past an unpadded one, whenever ranks do not divide a parameter).
def _full_numel(param: torch.nn.Parameter) -> int:
    return getattr(param, "ds_numel", param.numel())  # ZeRO-3 leaves an empty tensor in the module


def _my_partition(param: torch.nn.Parameter, value: torch.Tensor) -> torch.Tensor:
    """This rank's ZeRO-3 partition of a full ``value`` of ``param``: ceil(numel / ranks) elements, zero-padded."""
    import torch.distributed as dist

    group = getattr(param, "ds_process_group", None)  # the ranks this parameter is partitioned over
    size = param.ds_tensor.numel()
    flat = value.detach().reshape(-1).to(torch.float32)
    flat = torch.cat([flat, flat.new_zeros(size * dist.get_world_size(group) - flat.numel())])
    return flat.narrow(0, size * dist.get_rank(group), size)


def _zero_optimizer(engine: Any, what: str) -> Any:
    zero = engine.optimizer
    if not hasattr(zero, "optimizer"):  # no ZeRO optimizer wraps the user's (stage 0)
        raise ValueError(f"loading {what} into a DeepSpeed engine needs ZeRO (zero_stage 1, 2 or 3)")
    return zero


def _weights_into_engine(engine: Any, weights: Optional[Dict[str, torch.Tensor]], from_rank0: bool = False) -> None:
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_local_fp32_param

    from .operations import broadcast_object

    _zero_optimizer(engine, "full weights")
    module = engine.module
    parameters = dict(module.named_parameters())
    # what rank 0 holds: every rank learns it, so all raise together, or all take part in each broadcast
    layout = {name: (tuple(value.shape), value.dtype) for name, value in (weights or {}).items()}
    layout = broadcast_object(layout) if from_rank0 else layout
    missing = sorted(set(parameters) - set(layout))
    if missing:
        raise KeyError(f"the checkpoint has no weights for {', '.join(missing)}")

    def value_of(name: str, device: Any) -> torch.Tensor:
        if not from_rank0:
            return weights[name]  # type: ignore[index]
        return _from_rank0(weights[name] if weights is not None else None, *layout[name], device)

    for name, param in parameters.items():
        value = value_of(name, engine.device)  # one parameter at a time: no other rank holds the whole model
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            param.data.copy_(value.to(param.dtype).view_as(param))  # rank 0's copy is what is partitioned
        if hasattr(param, "ds_id"):
            safe_set_local_fp32_param(param, _my_partition(param, value))
        else:
            safe_set_full_fp32_param(param, value.to(torch.float32))
    for name, buffer in module.named_buffers():
        if name in layout:
            buffer.data.copy_(value_of(name, buffer.device))


def _from_rank0(value: Optional[torch.Tensor], shape: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """Rank 0's ``value`` (of ``shape`` and ``dtype``), on every rank."""
    import torch.distributed as dist

    tensor = value.to(device).contiguous() if value is not None else torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(tensor, src=0)
    return tensor


def _optimizer_state_into_engine(engine: Any, state: NamedOptimizerState) -> bool:
    """ZeRO-3 only (False below it: ZeRO-1/2 map their optimizer state to parameters only after a step)."""
    from deepspeed.utils import safe_set_local_optimizer_state

    zero = _zero_optimizer(engine, "an optimizer state")
    if not hasattr(zero, "fp32_partitioned_groups_flat"):
        return False
    parameters = dict(engine.module.named_parameters())
    unknown = sorted(set(state["state"]) - set(parameters))
    if unknown:
        raise KeyError(f"the checkpoint's optimizer state names {', '.join(unknown)}, which the model does not have")
    per_parameter = {key for entries in state["state"].values() for key, value in entries.items()
                     if torch.is_tensor(value) and value.dim() > 0}  # fmt: skip
    counts = {key: value for entries in state["state"].values() for key, value in entries.items()
              if key not in per_parameter}  # "step": one for all; DeepSpeed keeps one per flat partition  # fmt: skip
    inner = zero.optimizer  # the user's torch optimizer, which DeepSpeed steps on its flat fp32 partitions
    # ... and which creates its state at its first step: before that there is nowhere to load into, so the
    # entries are made here, for each flat partition (DeepSpeed's own attribute; its loaders use it too)
    for flat in zero.fp32_partitioned_groups_flat:
        entries = inner.state[flat]
        for key in per_parameter:
            entries.setdefault(key, torch.zeros_like(flat))
        entries.update({key: value.clone() if torch.is_tensor(value) else value for key, value in counts.items()})
    for name, entries in state["state"].items():
        for key in per_parameter & set(entries):
            safe_set_local_optimizer_state(parameters[name], _my_partition(parameters[name], entries[key]), key)
    for group, saved in zip(inner.param_groups, state["param_groups"]):  # the learning rate, momentum...
        group.update({key: value for key, value in saved.items() if key not in ("params", "param_names")})
    return True
