"""A DeepSpeed checkpoint (``save_state``'s ``model.deepspeed/``) as full state, for another number of ranks.

DeepSpeed's own ``load_checkpoint`` needs the ranks that saved: each loads its own partitions (ZeRO-3 fails on
any other number of ranks; "universal checkpoints" would need an offline conversion, for Adam only). Elsewhere
the partitions are merged here into full, name-keyed weights and optimizer state (see :mod:`.full_state`):
weights by DeepSpeed's ``zero_to_fp32`` (any stage), the optimizer state of ZeRO-3 by :func:`_merge_zero3`,
which lays out every state tensor as ``zero_to_fp32`` lays out the fp32 weights.
"""
from __future__ import annotations

import glob
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ["saved_ranks", "read_zero_checkpoint"]


def _rank_files(directory: str, kind: str) -> List[str]:
    """``zero_pp_rank_<r>_mp_rank_00_<kind>.pt`` (``bf16_`` prefixed under bf16), by rank."""
    files = glob.glob(os.path.join(directory, f"*zero_pp_rank_*_mp_rank_00_{kind}.pt"))
    return sorted(files, key=lambda path: int(re.search(r"zero_pp_rank_(\d+)_", os.path.basename(path)).group(1)))


def saved_ranks(directory: str) -> int:
    """How many data-parallel ranks wrote the checkpoint in ``directory`` (one optimizer file each)."""
    return len(_rank_files(directory, "optim_states"))


def _load(path: str) -> Any:
    # DeepSpeed pickles its own objects (the loss scaler, an enum) next to the tensors, and reads its files so
    return torch.load(path, map_location="cpu", weights_only=False)


def _merge_zero3(flat_by_rank: List[torch.Tensor], shapes: Dict[str, torch.Size]) -> Dict[str, torch.Tensor]:
    """Whole tensors from ZeRO-3 partitions: each rank's flat tensor holds, parameter after parameter, its
    ``ceil(numel / ranks)`` elements of each (the last rank's padded)."""
    ranks = len(flat_by_rank)
    merged: Dict[str, torch.Tensor] = {}
    offset = 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        part = math.ceil(numel / ranks)
        pieces = [flat[offset: offset + part] for flat in flat_by_rank]
        merged[name] = torch.cat(pieces)[:numel].view(shape).clone()
        offset += part
    if offset != flat_by_rank[0].numel():
        raise ValueError(f"the ZeRO-3 partitions hold {flat_by_rank[0].numel()} elements per rank, the parameters "
                         f"{offset}: the checkpoint does not match its own parameter list")  # fmt: skip
    return merged


def _zero3_optimizer_state(directory: str) -> Optional[Dict[str, Any]]:
    """The name-keyed full optimizer state of a ZeRO-3 checkpoint, or None below ZeRO-3."""
    optimizer_files = [_load(path)["optimizer_state_dict"] for path in _rank_files(directory, "optim_states")]
    if int(optimizer_files[0].get("zero_stage", 0)) != 3:
        return None
    # one ordered {name: shape} per sub-group, in the order of the flat partitions
    sub_groups: List[Dict[str, torch.Size]] = _load(_rank_files(directory, "model_states")[0])["param_shapes"]
    inner = [saved["optimizer_state_dict"] for saved in optimizer_files]  # the torch optimizer's, per rank
    shapes = {name: shape for sub_group in sub_groups for name, shape in sub_group.items()}
    per_parameter: Dict[str, Dict[str, Any]] = {name: {} for name in shapes}
    for key, value in inner[0]["state"].get(0, {}).items():
        if torch.is_tensor(value) and value.dim() > 0:
            flat = [torch.cat([rank["state"][index][key] for index in range(len(sub_groups))]) for rank in inner]
            for name, tensor in _merge_zero3(flat, shapes).items():
                per_parameter[name][key] = tensor
        else:
            for name in shapes:
                per_parameter[name][key] = value  # a count ("step"), the same for every partition
    groups = []
    for group in inner[0]["param_groups"]:  # a group's "params" are its sub-groups' indices
        names = [name for index in group["params"] for name in sub_groups[index]]
        groups.append({**{key: value for key, value in group.items() if key != "params"}, "params": names})
    state = {name: entries for name, entries in per_parameter.items() if entries}
    return {"state": state, "param_groups": groups}


def read_zero_checkpoint(directory: str, tag: str) -> Tuple[Dict[str, torch.Tensor], Optional[Dict[str, Any]]]:
    """Full fp32 weights, and the name-keyed optimizer state (ZeRO-3 only, else None), of ``directory/tag``."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    weights = get_fp32_state_dict_from_zero_checkpoint(directory, tag=tag)  # it says what it read, on each rank
    return weights, _zero3_optimizer_state(os.path.join(directory, tag))
