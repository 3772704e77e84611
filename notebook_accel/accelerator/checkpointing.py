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
partitions) into ``model.deepspeed``, which the same number of ranks loads with DeepSpeed itself.

Every other pairing goes through full state (:mod:`.full_state`): the plain files (a prototype on one process,
a DDP run) load into FSDP2-sharded models and DeepSpeed engines, and a DeepSpeed checkpoint is merged
(:mod:`.zero_checkpoint`: weights of any stage, ZeRO-3's optimizer state too) for another number of ranks,
FSDP2, or one process without DeepSpeed. ``optimizer.pt`` names its parameters (torch's ``param_names``) so that
its state finds them in a model prepared another way.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch

from .fsdp import is_sharded
from .full_state import (
    load_full_optimizer_state,
    load_full_weights,
    named_optimizer_state,
    optimizer_parameter_names,
    torch_optimizer,
    with_parameter_names,
    without_parameter_names,
)
from .operations import barrier, broadcast_object, world_size
from .rng import capture_rng_states, restore_rng_states
from .zero import is_engine
from .zero_checkpoint import read_zero_checkpoint, saved_ranks

__all__ = ["save_checkpoint", "load_checkpoint", "load_model_weights", "WEIGHT_FILES"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # what save_model writes (and Hugging Face's names)


def _numbered(stem: str, index: int) -> str:
    return f"{stem}.pt" if index == 0 else f"{stem}_{index}.pt"


def _sharded_dir(stem: str, index: int) -> str:
    return _numbered(stem, index)[: -len(".pt")] + ".dcp"


_DEEPSPEED_TAG = "state"


def _engine_dir(index: int) -> str:
    return _numbered("model", index)[: -len(".pt")] + ".deepspeed"


def _model_of(optimizer: Any, models: Sequence[torch.nn.Module]) -> Optional[torch.nn.Module]:
    """The prepared model whose parameters ``optimizer`` updates (FSDP2 optimizer state is keyed by its names)."""
    params = {id(param) for group in torch_optimizer(optimizer).param_groups for param in group["params"]}
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

    dcp.save({"optimizer": get_optimizer_state_dict(model, torch_optimizer(optimizer))}, checkpoint_id=path)


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
    state = {"optimizer": get_optimizer_state_dict(model, torch_optimizer(optimizer))}
    dcp.load(state, checkpoint_id=path)
    set_optimizer_state_dict(model, torch_optimizer(optimizer), state["optimizer"])


def _loader_state(loader: Any) -> Dict[str, Any]:
    randomness = getattr(loader, "randomness", None)
    # saved mid-epoch (the loader is iterating): resuming replays this epoch's order (skip_first_batches skips the
    # steps done), not the next epoch's
    running = loader in getattr(getattr(loader, "gradient_state", None), "active_loaders", ())
    return {
        "next_epoch": loader.epoch if running else getattr(loader, "_next_epoch", 0),
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
        elif process_index == 0:  # named, so that a sharded model's optimizer finds its parameters in it
            names = None if owner is None else optimizer_parameter_names(optimizer, owner)
            torch.save(with_parameter_names(optimizer.state_dict(), names),
                       os.path.join(directory, _numbered("optimizer", index)))  # fmt: skip
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


def _optimizers_of(model: torch.nn.Module, optimizers: Sequence[Any]) -> List[int]:
    """The indices of the optimizers that update ``model`` (a DeepSpeed engine's is tied to it)."""
    if is_engine(model):
        return [index for index, optimizer in enumerate(optimizers) if getattr(optimizer, "engine", None) is model]
    return [index for index, optimizer in enumerate(optimizers) if _model_of(optimizer, [model]) is model]


def _load_model(directory: str, index: int, model: torch.nn.Module, optimizers: Sequence[Any]) -> List[int]:
    """Model ``index`` from ``directory``; returns the indices of the optimizers restored with it."""
    engine_dir = os.path.join(directory, _engine_dir(index))
    if os.path.isdir(engine_dir):
        partners = _optimizers_of(model, optimizers)
        ranks = saved_ranks(os.path.join(engine_dir, _DEEPSPEED_TAG))
        if is_engine(model) and ranks == world_size():
            model.load_checkpoint(engine_dir, tag=_DEEPSPEED_TAG)  # each rank its own partitions
            return partners
        weights, state = read_zero_checkpoint(engine_dir, _DEEPSPEED_TAG)
        load_full_weights(model, weights)
        for partner in partners:
            if state is None:
                _optimizer_starts_fresh(partner, "the optimizer state of a ZeRO-1/2 checkpoint loads only into an "
                                                 f"engine on the {ranks} ranks that saved it")  # fmt: skip
            elif not load_full_optimizer_state(model, optimizers[partner], state):
                _optimizer_starts_fresh(partner, _BELOW_ZERO3)
        return partners
    sharded = os.path.join(directory, _sharded_dir("model", index))
    if os.path.isdir(sharded):
        if is_engine(model):
            raise ValueError(f"{sharded!r} holds FSDP2 shards (torch.distributed.checkpoint), which a DeepSpeed engine "
                             "does not load: load_state in one process without the plugin, save_state there, and "
                             "load those plain files into the engine")  # fmt: skip
        _load_sharded_model(model, sharded)
        return []
    path = _existing(directory, "model", index, "models")
    if is_engine(model) or is_sharded(model):  # a plain checkpoint: rank 0 reads it, each rank keeps its part
        load_full_weights(model, _load(path) if rank() == 0 else None, from_rank0=True)
    else:
        model.load_state_dict(_load(path))
    return []


def _load_optimizer(directory: str, index: int, optimizer: Any, models: Sequence[torch.nn.Module]) -> None:
    sharded = os.path.join(directory, _sharded_dir("optimizer", index))
    owner = getattr(optimizer, "engine", None) or _model_of(optimizer, models)
    if os.path.isdir(sharded):
        if owner is None or is_engine(owner):
            raise ValueError(f"{sharded!r} holds a sharded optimizer state keyed by parameter name, but optimizer "
                             f"{index} updates none of the prepared models' parameters (a DeepSpeed engine's "
                             "optimizer does not load it)")  # fmt: skip
        _load_sharded_optimizer(owner, optimizer, sharded)
        return
    saved = _load(_existing(directory, "optimizer", index, "optimizers"))
    if owner is not None and (is_engine(owner) or is_sharded(owner)):  # by name: the same state, cut differently
        names = optimizer_parameter_names(optimizer, owner)
        if not load_full_optimizer_state(owner, optimizer, named_optimizer_state(saved, names)):
            _optimizer_starts_fresh(index, _BELOW_ZERO3)
    else:
        optimizer.load_state_dict(without_parameter_names(saved, optimizer))


_BELOW_ZERO3 = "an engine below ZeRO-3 takes optimizer state only from its own checkpoint, on as many ranks"


def _optimizer_starts_fresh(index: int, why: str) -> None:
    # stacklevel: the user's load_state line (this, _load_*, load_checkpoint, Accelerator.load_state, the user)
    warnings.warn(f"optimizer {index}: {why}; the weights were loaded, the optimizer starts fresh", stacklevel=5)


def _existing(directory: str, stem: str, index: int, plural: str) -> str:
    path = os.path.join(directory, _numbered(stem, index))
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path!r} is missing: the checkpoint has fewer {plural} than were prepared; prepare the same "
            "objects, in the same order, as when saving."
        )
    return path


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
    restored = set()
    for index, model in enumerate(models):
        restored.update(_load_model(directory, index, model, optimizers))
    for index, optimizer in enumerate(optimizers):
        if index not in restored:
            _load_optimizer(directory, index, optimizer, models)
    for index, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(_load(_existing(directory, "scheduler", index, "schedulers")))
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


# ------------------------------------------------------------------------------------ Accelerator.load_model
def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _weight_files(path: str) -> List[str]:
    """The files of full weights at ``path``: the file itself, or in a directory what ``save_model`` writes, or
    Hugging Face's ``model.safetensors.index.json`` with the shards it lists."""
    if os.path.isfile(path):
        return [path]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        import json

        with open(index) as file:
            shards = sorted(set(json.load(file)["weight_map"].values()))
        return [os.path.join(path, shard) for shard in shards]
    for name in WEIGHT_FILES:
        if os.path.isfile(os.path.join(path, name)):
            return [os.path.join(path, name)]
    raise FileNotFoundError(f"no weights at {path!r}: give a .safetensors / .bin / .pt file, or a directory holding "
                            f"{' or '.join(WEIGHT_FILES)}, a model.safetensors.index.json, or model.dcp (save_state)")


def _read_weights(files: Sequence[str]) -> Dict[str, torch.Tensor]:
    weights: Dict[str, torch.Tensor] = {}
    for file in files:
        if file.endswith(".safetensors"):
            try:
                from safetensors.torch import load_file
            except ImportError as error:
                raise ImportError(f"{file} is a safetensors file: pip install safetensors") from error
            weights.update(load_file(file))
        else:
            weights.update(_load(file))
    return weights


def load_model_weights(model: torch.nn.Module, path: str, strict: bool = True) -> None:
    """:meth:`Accelerator.load_model`: full weights from ``path`` into ``model``, read by rank 0 only where the
    model is sharded (the others receive their parts), by every rank where each needs the whole model anyway."""
    if not is_engine(model) and any(param.is_meta or hasattr(param, "ds_id") for param in model.parameters()):
        raise ValueError("load_model: this model was built by init_module and is not prepared yet (its shards are "
                         "made by prepare): prepare it first, then load_model")
    sharded = path if os.path.isfile(os.path.join(path, ".metadata")) else os.path.join(path, _sharded_dir("model", 0))
    if os.path.isdir(sharded):  # torch.distributed.checkpoint shards: each rank reads its own
        if is_engine(model):
            raise ValueError(f"{sharded!r} holds FSDP2 shards, which a DeepSpeed engine does not load")
        _load_sharded_model(model, sharded)
        return
    if not (is_engine(model) or is_sharded(model)) or world_size() == 1:
        weights = _read_weights(_weight_files(path))
        target = getattr(model, "module", model)  # DDP
        target.load_state_dict(weights, strict=strict)
        return
    weights, problem = None, None
    if rank() == 0:
        try:
            weights = _read_weights(_weight_files(path))
        except (OSError, ImportError, RuntimeError) as error:
            problem = error
    problem = broadcast_object(problem)  # all ranks raise together, instead of waiting for rank 0's tensors
    if problem is not None:
        raise problem
    load_full_weights(model, weights, from_rank0=True, strict=strict)
