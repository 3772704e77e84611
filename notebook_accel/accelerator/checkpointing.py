"""``save_state`` / ``load_state``: everything needed to resume training where it stopped, in HF accelerate's files.

Layout of a checkpoint directory: HF accelerate 1.x's names and formats, so a checkpoint moves both ways between
the two libraries (plain models: one process or DDP)::

    model.safetensors, model_1.safetensors, ...   the prepared models' state_dicts                  (main process)
      (pytorch_model.bin, pytorch_model_1.bin with save_state(safe_serialization=False))
    optimizer.bin, optimizer_1.bin, ...           optimizer state_dicts (torch.save)                 (main process)
    scheduler.bin, ...                            scheduler state_dicts (torch.save)                 (main process)
    scaler.pt                                     the fp16 GradScaler, when there is one             (main process)
    random_states_<rank>.pkl                      each rank's RNG states, HF's keys (every rank), and our data
                                                  loaders' epoch and seed (a key HF does not read)

As in HF, a model is saved under its own keys (not DDP's ``module.`` ones); reading, a ``module.`` prefix (a state
dict someone saved from a DDP wrapper) is removed or added to fit the model. Weights and optimizer states are identical on every rank after a DDP step, so one copy is enough;
RNG states differ per rank (dropout), so every rank writes its own.

Not HF's (and not portable to or from HF): a model sharded with FSDP2 (and its optimizer) is saved by every rank,
with ``torch.distributed.checkpoint``, as a directory ``model.dcp`` / ``optimizer.dcp`` of shards keyed by
parameter name (HF writes ``pytorch_model_fsdp_0/``): it loads on any number of ranks here — sharded or not, one
process included — because torch.distributed.checkpoint reshards on load. A DeepSpeed engine saves itself (with
its optimizer's partitions) into ``model.deepspeed`` (HF: ``pytorch_model/``), which the same number of ranks
loads with DeepSpeed itself.

Every other pairing goes through full state (:mod:`.full_state`): the plain files (a prototype on one process,
a DDP run, HF's) load into FSDP2-sharded models and DeepSpeed engines, and a DeepSpeed checkpoint is merged
(:mod:`.zero_checkpoint`: weights of any stage, ZeRO-3's optimizer state too) for another number of ranks,
FSDP2, or one process without DeepSpeed. ``optimizer.bin`` is torch's plain state_dict (parameters by position, as
HF writes it); loaded into a sharded model, its parameters are named by the optimizer it is loaded into.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from .fsdp import is_sharded
from .full_state import (
    load_full_optimizer_state,
    load_full_weights,
    named_optimizer_state,
    optimizer_parameter_names,
    torch_optimizer,
    without_parameter_names,
)
from .operations import barrier, broadcast_object, world_size
from .rng import capture_rng_states, restore_rng_states
from .zero import is_engine
from .zero_checkpoint import read_zero_checkpoint, saved_ranks

__all__ = ["save_checkpoint", "load_checkpoint", "load_model_weights", "WEIGHT_FILES", "save_object", "load_object",
           "save", "load", "save_sharded_weights"]

# HF accelerate's file names (accelerate.utils.constants)
SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHT_FILES = (SAFE_WEIGHTS_NAME, WEIGHTS_NAME)  # what save_model writes (and Hugging Face's names)
SCALER_NAME = "scaler.pt"
_DDP_PREFIX = "module."
# ours, in HF's random_states file (HF reads only its own keys): the loaders' epoch and seed, and the optimizers'
# parameter names (optimizer.bin is torch's plain state_dict, by position, as HF writes it: the names let a sharded
# model or a DeepSpeed engine find its parameters' state)
_LOADERS_KEY = "notebook_accel_loaders"
_OPTIMIZER_NAMES_KEY = "notebook_accel_optimizer_parameter_names"
_OPTIMIZER_STEPS_KEY = "notebook_accel_optimizer_steps"  # accelerator.optimizer_steps: where a resumed loop starts


def _numbered(name: str, index: int) -> str:
    """HF's numbering: ``optimizer.bin``, ``optimizer_1.bin``, ``model_1.safetensors``..."""
    stem, extension = name.split(".", 1)
    return name if index == 0 else f"{stem}_{index}.{extension}"


def _sharded_dir(stem: str, index: int) -> str:
    return _numbered(f"{stem}.dcp", index)


_DEEPSPEED_TAG = "state"


def _engine_dir(index: int) -> str:
    return _numbered("model.deepspeed", index)


def _rng_file(process_index: int) -> str:
    return f"random_states_{process_index}.pkl"


def save_object(obj: Any, path: str, safe_serialization: bool = False) -> None:
    """One file, written as HF's ``accelerate.utils.save`` writes it: safetensors (a dict of tensors; the
    tensors copied to own, contiguous CPU storage, which safetensors needs for tied weights) or ``torch.save``."""
    if not safe_serialization:
        torch.save(obj, path)
        return
    try:
        from safetensors.torch import save_file
    except ImportError as error:
        raise ImportError("safe_serialization=True writes safetensors: pip install safetensors, or pass "
                          "safe_serialization=False for a torch.save file") from error
    save_file({key: value.detach().cpu().contiguous().clone() for key, value in obj.items()}, path,
              metadata={"format": "pt"})  # fmt: skip


def save(obj: Any, f: Any, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """HF's ``accelerate.utils.save``: ``torch.save`` (or safetensors) on the main process only (on each node's
    local main process with ``save_on_each_node``); the other ranks write nothing and do not wait."""
    main = int(os.environ.get("LOCAL_RANK", "0")) == 0 if save_on_each_node else rank() == 0
    if main:
        save_object(obj, f, safe_serialization)


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """HF's ``accelerate.utils.load``: ``torch.load`` with ``weights_only=True`` unless given (numpy's RNG arrays
    allowed); a ``.safetensors`` file as a dict of tensors."""
    return load_object(f, map_location=map_location, **kwargs)


_SIZE_UNITS = {"TIB": 2**40, "GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "TB": 10**12, "GB": 10**9, "MB": 10**6,
               "KB": 10**3, "B": 1}  # fmt: skip


def _size_in_bytes(size: Union[int, str]) -> int:
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    for unit, factor in _SIZE_UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    raise ValueError(f"max_shard_size={size!r}: give bytes (an int) or a size such as '10GB', '500MB', '2GiB'")


def save_sharded_weights(weights: Dict[str, torch.Tensor], directory: str, max_shard_size: Union[int, str],
                         safe_serialization: bool) -> str:
    """``save_model``'s files, as HF (huggingface_hub's split) names them: ``model.safetensors`` when the weights
    fit in one shard, else ``model-00001-of-0000N.safetensors``... and ``model.safetensors.index.json`` (its
    ``weight_map`` and ``metadata.total_size``); ``pytorch_model*.bin`` without safetensors. Tensors go to shards
    in the state_dict's order, a new shard when the next would pass ``max_shard_size`` (one too big alone gets its
    own). Stale shards of an earlier save are removed. Returns the single file's or the index's path."""
    import json
    import re

    limit = _size_in_bytes(max_shard_size)
    shards: List[Dict[str, torch.Tensor]] = [{}]
    current = 0
    for key, tensor in weights.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and (size > limit or current + size > limit):
            shards.append({})
            current = 0
        shards[-1][key] = tensor
        current += size
    stem, extension = ("model", "safetensors") if safe_serialization else ("pytorch_model", "bin")
    if len(shards) == 1:
        names = [f"{stem}.{extension}"]
    else:
        names = [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.{extension}" for i in range(len(shards))]
    stale = re.compile(rf"{stem}-\d{{5}}-of-\d{{5}}\.{extension}")
    for name in os.listdir(directory):
        if stale.fullmatch(name) and name not in names:
            os.remove(os.path.join(directory, name))
    for name, shard in zip(names, shards):
        save_object(shard, os.path.join(directory, name), safe_serialization)
    if len(shards) == 1:
        return os.path.join(directory, names[0])
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in weights.values())},
             "weight_map": {key: name for name, shard in zip(names, shards) for key in shard}}  # fmt: skip
    path = os.path.join(directory, f"{stem}.{extension}.index.json")
    with open(path, "w", encoding="utf-8") as file:
        file.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return path


def load_object(path: str, map_location: Any = "cpu", **kwargs: Any) -> Any:
    """What :func:`save_object` (or HF's ``save``) wrote: a safetensors file as a dict of tensors, anything else
    with ``torch.load`` (``weights_only=True`` unless given, numpy's RNG arrays allowed, as HF's ``load``)."""
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device=str(map_location or "cpu"))
    kwargs.setdefault("weights_only", True)
    if not kwargs["weights_only"]:
        return torch.load(path, map_location=map_location, **kwargs)
    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(path, map_location=map_location, **kwargs)


def _numpy_globals() -> List[Any]:
    """numpy's RNG state (an array of numbers) is safe to unpickle under weights_only: what HF allows too."""
    try:
        import numpy as np
    except ImportError:
        return []
    from codecs import encode  # numpy pickles its arrays' bytes through it

    core = getattr(np, "_core", None) or np.core
    found = [core.multiarray._reconstruct, np.ndarray, np.dtype, encode]
    # numpy 2 pickles dtypes by their class (numpy.dtypes.UInt32DType...)
    found += [getattr(np.dtypes, name) for name in dir(getattr(np, "dtypes", object())) if name.endswith("DType")]
    return found


def _fit_keys(weights: Dict[str, Any], model: torch.nn.Module) -> Dict[str, Any]:
    """A state_dict saved from a DDP model (``module.`` keys) into a plain one, or the other way round."""
    expected = next(iter(model.state_dict()), "")
    saved = next(iter(weights), "")
    if saved.startswith(_DDP_PREFIX) and not expected.startswith(_DDP_PREFIX):
        return {key[len(_DDP_PREFIX):] if key.startswith(_DDP_PREFIX) else key: value for key, value in weights.items()}
    if expected.startswith(_DDP_PREFIX) and not saved.startswith(_DDP_PREFIX):
        return {_DDP_PREFIX + key: value for key, value in weights.items()}
    return weights


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
        # HF's default order: the generator seeded once at prepare (HF saves nothing of it, so a resume there
        # starts it afresh); here the order resumes where it was
        "generator_state": None if randomness is None else randomness.generator_state(running),
    }


def _restore_loader(loader: Any, state: Dict[str, Any]) -> None:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(state["next_epoch"])
    randomness = getattr(loader, "randomness", None)
    if randomness is not None and state.get("base_seed") is not None:
        randomness.base_seed = state["base_seed"]
    generator = getattr(randomness, "synchronized", None)
    if generator is not None and state.get("generator_state") is not None:
        generator.set_state(state["generator_state"])


def save_checkpoint(
    directory: str,
    *,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    scaler: Optional[Any],
    loaders: Sequence[Any],
    process_index: int,
    safe_serialization: bool = True,
    step: int = 0,
    optimizer_steps: int = 0,
) -> str:
    """Write the checkpoint (see the module docstring); every rank must call it. Returns ``directory``.
    ``step``: HF's accumulation step counter, saved in the RNG files as HF does; ``optimizer_steps``: ours, beside
    it (``accelerator.optimizer_steps``)."""
    barrier()  # every rank has finished the step being saved
    os.makedirs(directory, exist_ok=True)
    for index, model in enumerate(models):
        if is_engine(model):  # the engine writes its module and every rank's optimizer partition
            model.save_checkpoint(os.path.join(directory, _engine_dir(index)), tag=_DEEPSPEED_TAG)
        elif is_sharded(model):  # every rank writes its shards (a collective: all ranks, same order)
            _save_sharded_model(model, os.path.join(directory, _sharded_dir("model", index)))
        elif process_index == 0:
            weights = model.state_dict()
            name = SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
            save_object(weights, os.path.join(directory, _numbered(name, index)), safe_serialization)
    for index, optimizer in enumerate(optimizers):
        if hasattr(optimizer, "engine"):
            continue  # saved with its DeepSpeed engine
        owner = _model_of(optimizer, models)
        if owner is not None and is_sharded(owner):
            _save_sharded_optimizer(owner, optimizer, os.path.join(directory, _sharded_dir("optimizer", index)))
        elif process_index == 0:  # torch's own state_dict, as HF writes it
            torch.save(optimizer.state_dict(), os.path.join(directory, _numbered("optimizer.bin", index)))
    if process_index == 0:
        for index, scheduler in enumerate(schedulers):
            torch.save(scheduler.state_dict(), os.path.join(directory, _numbered("scheduler.bin", index)))
        if scaler is not None:
            torch.save(scaler.state_dict(), os.path.join(directory, SCALER_NAME))
    names = []
    for optimizer in optimizers:
        owner = None if hasattr(optimizer, "engine") else _model_of(optimizer, models)
        plain = owner is not None and not is_sharded(owner) and not is_engine(owner)
        names.append(optimizer_parameter_names(optimizer, owner) if plain else None)
    per_rank = {"step": step, **_hf_rng_states(capture_rng_states()),
                _LOADERS_KEY: [_loader_state(loader) for loader in loaders], _OPTIMIZER_NAMES_KEY: names,
                _OPTIMIZER_STEPS_KEY: optimizer_steps}
    torch.save(per_rank, os.path.join(directory, _rng_file(process_index)))
    barrier()  # the files are complete before anyone reads them
    return directory


# HF's keys in random_states_<rank>.pkl <-> ours (rng.capture_rng_states)
_HF_RNG_KEYS = {"python": "random_state", "numpy": "numpy_random_seed", "torch": "torch_manual_seed",
                "cuda": "torch_cuda_manual_seed"}  # fmt: skip


def _hf_rng_states(states: Dict[str, Any]) -> Dict[str, Any]:
    return {_HF_RNG_KEYS[key]: value for key, value in states.items() if key in _HF_RNG_KEYS}


def _our_rng_states(saved: Dict[str, Any]) -> Dict[str, Any]:
    return {ours: saved[hf] for ours, hf in _HF_RNG_KEYS.items() if hf in saved}


def _load(path: str) -> Any:
    # weights_only=True (safe even for foreign files), numpy's RNG arrays allowed
    return load_object(path, map_location="cpu")


def _optimizers_of(model: torch.nn.Module, optimizers: Sequence[Any]) -> List[int]:
    """The indices of the optimizers that update ``model`` (a DeepSpeed engine's is tied to it)."""
    if is_engine(model):
        return [index for index, optimizer in enumerate(optimizers) if getattr(optimizer, "engine", None) is model]
    return [index for index, optimizer in enumerate(optimizers) if _model_of(optimizer, [model]) is model]


def _load_model(directory: str, index: int, model: torch.nn.Module, optimizers: Sequence[Any],
                load_model_kwargs: Optional[Dict[str, Any]] = None) -> List[int]:
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
    path = _existing(directory, [SAFE_WEIGHTS_NAME, WEIGHTS_NAME], index, "models")
    if is_engine(model) or is_sharded(model):  # a plain checkpoint: rank 0 reads it, each rank keeps its part
        weights = _fit_keys(_load(path), getattr(model, "module", model)) if rank() == 0 else None
        load_full_weights(model, weights, from_rank0=True)
    else:
        model.load_state_dict(_fit_keys(_load(path), model), **(load_model_kwargs or {}))
    return []


def _load_optimizer(directory: str, index: int, optimizer: Any, models: Sequence[torch.nn.Module],
                    saved_names: Optional[List[List[str]]] = None) -> None:
    sharded = os.path.join(directory, _sharded_dir("optimizer", index))
    owner = getattr(optimizer, "engine", None) or _model_of(optimizer, models)
    if os.path.isdir(sharded):
        if owner is None or is_engine(owner):
            raise ValueError(f"{sharded!r} holds a sharded optimizer state keyed by parameter name, but optimizer "
                             f"{index} updates none of the prepared models' parameters (a DeepSpeed engine's "
                             "optimizer does not load it)")  # fmt: skip
        _load_sharded_optimizer(owner, optimizer, sharded)
        return
    saved = _load(_existing(directory, ["optimizer.bin"], index, "optimizers"))
    if owner is not None and (is_engine(owner) or is_sharded(owner)):  # by name: the same state, cut differently
        names = saved_names or optimizer_parameter_names(optimizer, owner)
        if not load_full_optimizer_state(owner, optimizer, named_optimizer_state(saved, names)):
            _optimizer_starts_fresh(index, _BELOW_ZERO3)
    else:
        optimizer.load_state_dict(without_parameter_names(saved, optimizer))


_BELOW_ZERO3 = "an engine below ZeRO-3 takes optimizer state only from its own checkpoint, on as many ranks"


def _optimizer_starts_fresh(index: int, why: str) -> None:
    # stacklevel: the user's load_state line (this, _load_*, load_checkpoint, Accelerator.load_state, the user)
    warnings.warn(f"optimizer {index}: {why}; the weights were loaded, the optimizer starts fresh", stacklevel=5)


def _existing(directory: str, names: Sequence[str], index: int, plural: str) -> str:
    """The first of ``names`` (numbered for ``index``) that the checkpoint holds."""
    paths = [os.path.join(directory, _numbered(name, index)) for name in names]
    for path in paths:
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        f"{' or '.join(map(repr, paths))} is missing: the checkpoint has fewer {plural} than were prepared; prepare "
        "the same objects, in the same order, as when saving."
    )


def _saved_by_rank_0(directory: str) -> Optional[Dict[str, Any]]:
    """Rank 0's random_states file (another number of ranks may have saved: this rank's may be missing)."""
    path = os.path.join(directory, _rng_file(0))
    return _load(path) if os.path.exists(path) else None


def load_checkpoint(
    directory: str,
    *,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    scaler: Optional[Any],
    loaders: Sequence[Any],
    process_index: int,
    load_model_kwargs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Restore what :func:`save_checkpoint` (or HF's ``save_state``) wrote into the (already prepared) objects, on
    every rank. Returns what HF's ``load_accelerator_state`` returns: ``{"step": ...}`` when the file has it, and
    ``"optimizer_steps"`` when ours wrote it.
    ``load_model_kwargs``: for the models' ``load_state_dict`` (``strict=``)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoint directory at {directory!r}")
    rng_path = os.path.join(directory, _rng_file(process_index))
    per_rank = _load(rng_path) if os.path.exists(rng_path) else None
    first_rank = per_rank if process_index == 0 else _saved_by_rank_0(directory)
    saved_names = (first_rank or {}).get(_OPTIMIZER_NAMES_KEY) or []
    restored = set()
    for index, model in enumerate(models):
        restored.update(_load_model(directory, index, model, optimizers, load_model_kwargs))
    for index, optimizer in enumerate(optimizers):
        if index not in restored:
            names = saved_names[index] if index < len(saved_names) else None
            _load_optimizer(directory, index, optimizer, models, names)
    for index, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(_load(_existing(directory, ["scheduler.bin"], index, "schedulers")))
    if scaler is not None and os.path.exists(os.path.join(directory, SCALER_NAME)):
        scaler.load_state_dict(_load(os.path.join(directory, SCALER_NAME)))

    override: Dict[str, Any] = {}
    if per_rank is None:
        warnings.warn(f"{rng_path!r} is missing (saved with fewer processes?): RNG states not restored",
                      stacklevel=3)
    else:
        restore_rng_states(_our_rng_states(per_rank))
        if "step" in per_rank:
            override["step"] = per_rank["step"]
        if _OPTIMIZER_STEPS_KEY in per_rank:
            override["optimizer_steps"] = per_rank[_OPTIMIZER_STEPS_KEY]
        saved_loaders: List[Dict[str, Any]] = per_rank.get(_LOADERS_KEY, [])
        for loader, state in zip(loaders, saved_loaders):
            _restore_loader(loader, state)
    barrier()
    return override


# ------------------------------------------------------------------------------------ Accelerator.load_model
def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _weight_files(path: str) -> List[str]:
    """The files of full weights at ``path``: the file itself, or in a directory what ``save_model`` writes, or
    Hugging Face's ``model.safetensors.index.json`` with the shards it lists."""
    if os.path.isfile(path):
        return [path]
    index = next((os.path.join(path, name) for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                  if os.path.isfile(os.path.join(path, name))), "")  # fmt: skip
    if index:
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
