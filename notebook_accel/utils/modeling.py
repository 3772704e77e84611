"""``accelerate.utils``' model-file helpers: ``get_max_memory``, ``merge_fsdp_weights`` and HF's file names."""
from __future__ import annotations

import os
import re
import shutil
from typing import Dict, Optional, Union

import torch

__all__ = ["WEIGHTS_NAME", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_INDEX_NAME", "get_max_memory",
           "merge_fsdp_weights", "convert_file_size_to_int"]  # fmt: skip

# HF's file names (transformers' too): a model's weights, as a pickle or as safetensors, and their shard indexes
WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"

_UNITS = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
          "TB": 10**12, "B": 1}  # fmt: skip


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """``"10GB"`` -> 10**10, ``"1GiB"`` -> 2**30 (an int is returned as is)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]I?B|B)\s*", size.upper())
    if match is None:
        raise ValueError(f"`size` {size!r} is not in a valid format: use an integer or a string like '5GB'")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit])


def get_max_memory(max_memory: Optional[Dict[Union[int, str], Union[int, str]]] = None) -> Dict[Union[int, str], int]:
    """The memory each device may use, in bytes: each CUDA device's free memory (keys 0, 1, ...) and ``"cpu"``'s
    available RAM; given ``max_memory``, its string sizes ("10GiB") converted to ints."""
    if max_memory is not None:
        return {key: convert_file_size_to_int(value) for key, value in max_memory.items()}
    import psutil

    found: Dict[Union[int, str], int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            found[index] = torch.cuda.mem_get_info(index)[0]
    found["cpu"] = psutil.virtual_memory().available
    return found


def merge_fsdp_weights(checkpoint_dir: str, output_path: str, safe_serialization: bool = True,
                       remove_checkpoint_dir: bool = False) -> None:
    """One weights file from a sharded checkpoint (a ``torch.distributed.checkpoint`` directory: HF's
    ``pytorch_model_fsdp_0``, or ours ``model.dcp``): ``output_path/model.safetensors``, or ``pytorch_model.bin``
    with ``safe_serialization=False``. Runs in one process, on the CPU."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    if not os.path.isdir(checkpoint_dir):
        raise ValueError(f"Tried to load from {checkpoint_dir} but couldn't find a valid checkpoint directory")
    state: Dict[str, object] = {}
    _load_state_dict(state, storage_reader=dcp.FileSystemReader(checkpoint_dir),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)  # fmt: skip
    if len(state) == 1 and isinstance(next(iter(state.values())), dict):  # {"model": {...}}, as HF saves it
        state = next(iter(state.values()))  # type: ignore[assignment]
    os.makedirs(output_path, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file

        tensors = {name: value.contiguous() for name, value in state.items() if isinstance(value, torch.Tensor)}
        save_file(tensors, os.path.join(output_path, SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
    else:
        torch.save(state, os.path.join(output_path, WEIGHTS_NAME))
    if remove_checkpoint_dir:
        shutil.rmtree(checkpoint_dir)
