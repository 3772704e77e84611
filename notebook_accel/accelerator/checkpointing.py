"""``save_state`` / ``load_state``: everything needed to resume training where it stopped.

Layout of a checkpoint directory (one file per object, so a partial load stays easy)::

    model.pt, model_1.pt, ...          unwrapped state_dicts of the prepared models      (main process)
    optimizer.pt, optimizer_1.pt, ...  optimizer state_dicts                              (main process)
    scheduler.pt, ...                  scheduler state_dicts                              (main process)
    scaler.pt                          the fp16 GradScaler, when there is one             (main process)
    random_states_<rank>.pt            each rank's RNG states and its data loaders' epoch (every rank)

Weights and optimizer states are identical on every rank after a DDP step, so one copy is enough;
RNG states differ per rank (dropout), so every rank writes its own.

A model sharded with FSDP2 (and its optimizer) is saved by every rank instead, with
``torch.distributed.checkpoint``, as a directory ``model.dcp`` / ``optimizer.dcp`` of shards keyed by
parameter name: it loads on any number of ranks — sharded or not, one process included — because
torch.distributed.checkpoint reshards on load. A DeepSpeed engine saves itself (with its optimizer's
partitions) into ``model.deepspeed``; one process without DeepSpeed loads its full fp32 weights from there.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch

from .fsdp import is_sharded
from .operations import barrier
from .zero import is_engine
from .rng import capture_rng_states, restore_rng_states

__all__ = ["save_checkpoint", "load_checkpoint"]


def _numbered(stem: str, index: int) -> str:
    return f"{stem}.pt" if index == 0 else f"{stem}_{index}.pt"


def _sharded_dir(stem: str, index: int) -> str:
    return _numbered(stem, index)[: -len(".pt")] + ".dcp"


_DEEPSPEED_TAG = "state"


def _engine_dir(index: int) -> str:
    return _numbered("model", index)[: -len(".pt")] + ".deepspeed"


def _load_deepspeed_weights(model: torch.nn.Module, path: str) -> None:
    """A DeepSpeed checkpoint's full fp32 weights into a plain module (ZeRO partitions merged)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(path, tag=_DEEPSPEED_TAG))


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # an AcceleratedOptimizer wraps the user's


def _model_of(optimizer: Any, models: Sequence[torch.nn.Module]) -> Optional[torch.nn.Module]:
    """The prepared model whose parameters ``optimizer`` updates (FSDP2 optimizer state is keyed by its names)."""
    params = {id(param) for group in _torch_optimizer(optimizer).param_groups for param in group["params"]}
    for model in models:
        if any(id(param) in params for param in model.parameters()):
            return model
    return None


def _save_sharded_model(model: torch.nn.Module, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)


def _save_sharded_optimizer(model: torch.nn.Module, optimizer: Any, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, _torch_optimizer(optimizer))}, checkpoint_id=path)


def _quiet_single_process(load: Any) -> Any:
    """dcp.load without a process group warns that it assumes one process: here that is the intent (a
    checkpoint saved on N ranks, loaded by one)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            return load(*args, **kwargs)

    return run


@_quiet_single_process
def _load_sharded_model(model: torch.nn.Module, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}  # the shapes (and shards) this run holds: dcp fills them
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])


@_quiet_single_process
def _load_sharded_optimizer(model: torch.nn.Module, optimizer: Any, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    # get_optimizer_state_dict initialises an empty optimizer's state (a zero step) so there is room to load
    state = {"optimizer": get_optimizer_state_dict(model, _torch_optimizer(optimizer))}
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(model, _torch_optimizer(optimizer), state["optimizer"])


def _loader_state(loader: Any) -> Dict[str, Any]:
    randomness = getattr(loader, "randomness", None)
    return {
        "next_epoch": getattr(loader, "_next_epoch", 0),
        "base_seed": None if randomness is None else randomness.base_seed,
    }


def _restore_loader(loader: Any, state: Dict[str, Any]) -> None:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(state["next_epoch"])
    randomness = getattr(loader, "randomness", None)
    if randomness is not None and state.get("base_seed") is not None:
        randomness.base_seed = state["base_seed"]


def save_checkpoint(
    directory: str,
    *,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    scaler: Optional[Any],
    loaders: Sequence[Any],
    process_index: int,
) -> str:
    """Write the checkpoint (see the module docstring); every rank must call it. Returns ``directory``."""
    barrier()  # every rank has finished the step being saved
    os.makedirs(directory, exist_ok=True)
    for index, model in enumerate(models):
        if is_engine(model):  # the engine writes its module and every rank's optimizer partition
            model.save_checkpoint(os.path.join(directory, _engine_dir(index)), tag=_DEEPSPEED_TAG)
        elif is_sharded(model):  # every rank writes its shards (a collective: all ranks, same order)
            _save_sharded_model(model, os.path.join(directory, _sharded_dir("model", index)))
        elif process_index == 0:
            torch.save(model.state_dict(), os.path.join(directory, _numbered("model", index)))
    for index, optimizer in enumerate(optimizers):
        if hasattr(optimizer, "engine"):
            continue  # saved with its DeepSpeed engine
        owner = _model_of(optimizer, models)
        if owner is not None and is_sharded(owner):
            _save_sharded_optimizer(owner, optimizer, os.path.join(directory, _sharded_dir("optimizer", index)))
        elif process_index == 0:
            torch.save(optimizer.state_dict(), os.path.join(directory, _numbered("optimizer", index)))
    if process_index == 0:
        for index, scheduler in enumerate(schedulers):
            torch.save(scheduler.state_dict(), os.path.join(directory, _numbered("scheduler", index)))
        if scaler is not None:
            torch.save(scaler.state_dict(), os.path.join(directory, "scaler.pt"))
    per_rank = {"rng": capture_rng_states(), "loaders": [_loader_state(loader) for loader in loaders]}
    torch.save(per_rank, os.path.join(directory, f"random_states_{process_index}.pt"))
    barrier()  # the files are complete before anyone reads them
    return directory


def _load(path: str, trusted: bool = False) -> Any:
    # Weights load with weights_only=True (safe even for foreign files); the RNG file holds numpy
    # arrays and python tuples that only a full unpickle restores, and is always our own.
    return torch.load(path, map_location="cpu", weights_only=not trusted)


def load_checkpoint(
    directory: str,
    *,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    scaler: Optional[Any],
    loaders: Sequence[Any],
    process_index: int,
) -> None:
    """Restore what :func:`save_checkpoint` wrote into the (already prepared) objects, on every rank."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoint directory at {directory!r}")
    groups = (("model", models), ("optimizer", optimizers), ("scheduler", schedulers))
    for stem, objects in groups:
        for index, obj in enumerate(objects):
            sharded = os.path.join(directory, _sharded_dir(stem, index))
            engine_dir = os.path.join(directory, _engine_dir(index))
            if stem == "model" and os.path.isdir(engine_dir):
                if is_engine(obj):
                    obj.load_checkpoint(engine_dir, tag=_DEEPSPEED_TAG)
                else:
                    _load_deepspeed_weights(obj, engine_dir)
                continue
            if stem == "optimizer" and hasattr(obj, "engine"):
                continue  # loaded with its engine
            if stem == "optimizer" and not os.path.exists(os.path.join(directory, _numbered(stem, index))) and any(
                name.endswith(".deepspeed") for name in os.listdir(directory)
            ):
                warnings.warn(f"optimizer {index}: a DeepSpeed checkpoint's optimizer state loads only into a "
                              "DeepSpeed engine; the weights were loaded, the optimizer starts fresh", stacklevel=3)
                continue
            if stem == "model" and os.path.isdir(sharded):
                _load_sharded_model(obj, sharded)
                continue
            if stem == "optimizer" and os.path.isdir(sharded):
                owner = _model_of(obj, models)
                if owner is None:
                    raise ValueError(f"{sharded!r} holds a sharded optimizer state keyed by parameter name, but "
                                     f"optimizer {index} updates none of the prepared models' parameters")
                _load_sharded_optimizer(owner, obj, sharded)
                continue
            path = os.path.join(directory, _numbered(stem, index))
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path!r} is missing: the checkpoint has fewer {stem}s than were prepared "
                    f"({len(objects)}); prepare the same objects, in the same order, as when saving."
                )
            obj.load_state_dict(_load(path))
    if scaler is not None and os.path.exists(os.path.join(directory, "scaler.pt")):
        scaler.load_state_dict(_load(os.path.join(directory, "scaler.pt")))

    rng_path = os.path.join(directory, f"random_states_{process_index}.pt")
    if not os.path.exists(rng_path):
        warnings.warn(f"{rng_path!r} is missing (saved with fewer processes?): RNG states not restored",
                      stacklevel=3)
    else:
        per_rank = _load(rng_path, trusted=True)
        restore_rng_states(per_rank["rng"])
        saved_loaders: List[Dict[str, Any]] = per_rank.get("loaders", [])
        for loader, state in zip(loaders, saved_loaders):
            _restore_loader(loader, state)
    barrier()
