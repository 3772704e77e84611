"""``accelerate.utils.operations``'s names, with HF's parameters: the collectives over nested tensors.

``gather(tensor)``, ``reduce(tensor, reduction="mean", scale=1.0)``, ``pad_across_processes(tensor, ...)`` and
``broadcast(tensor, from_process=0)`` check the ranks' shapes first in debug mode (``ACCELERATE_DEBUG_MODE=1`` or
``PartialState().debug = True``) and raise :class:`DistributedOperationException` where they differ.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable, List, Optional, Union

import torch

from ..accelerator import op_checker, operations
from ..accelerator.op_checker import DistributedOperationException
from ..accelerator.utilities import broadcast_object_list, gather_object, recursively_apply

__all__ = ["DistributedOperationException", "broadcast", "broadcast_object_list", "concatenate",
           "copy_tensor_to_devices", "find_batch_size", "find_device", "gather", "gather_object", "is_torch_tensor",
           "listify", "pad_across_processes", "recursively_apply", "reduce", "send_to_device"]  # fmt: skip


def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def send_to_device(tensor: Any, device: Union[str, torch.device], non_blocking: bool = False,
                   skip_keys: Optional[Union[str, Iterable[str]]] = None) -> Any:
    """Every tensor (and object with a ``.to``) of a nested structure on ``device``; the values of mappings' keys
    named in ``skip_keys`` stay where they are."""
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if skip_keys and isinstance(tensor, Mapping):
        return type(tensor)({key: value if key in skip_keys else send_to_device(value, device, non_blocking, skip_keys)
                             for key, value in tensor.items()})  # fmt: skip
    return operations.send_to_device(tensor, device, non_blocking=non_blocking)


def gather(tensor: Any) -> Any:
    """Every rank's tensors, concatenated along dim 0 in rank order (same containers back)."""
    return op_checker.gather(tensor)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Every tensor reduced over the ranks ("mean" by default here, as HF's; ``Accelerator.reduce``: "sum")."""
    reduced = op_checker.reduce(tensor, reduction)
    return reduced if scale == 1.0 else operations.tree_map(lambda value: value * scale, reduced)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Every tensor padded along ``dim`` to the largest size on any rank."""
    return op_checker.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Rank ``from_process``'s tensors on every rank (same shapes required)."""
    return op_checker.broadcast(tensor, from_process)


def copy_tensor_to_devices(tensor: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The main process's ``tensor`` on every rank's device (the other ranks pass None)."""
    from ..accelerator.partial_state import PartialState

    state = PartialState()
    value = operations.broadcast_object(tensor.cpu() if tensor is not None else None)
    return value.to(state.device)


def concatenate(data: List[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-structured nested tensors along ``dim``."""
    if isinstance(data[0], (tuple, list)):
        return type(data[0])(concatenate([item[index] for item in data], dim=dim) for index in range(len(data[0])))
    if isinstance(data[0], Mapping):
        return type(data[0])({key: concatenate([item[key] for item in data], dim=dim) for key in data[0]})
    if not isinstance(data[0], torch.Tensor):
        raise TypeError(f"Can only concatenate tensors but got {type(data[0])}")
    return torch.cat(data, dim=dim)


def find_batch_size(data: Any) -> int:
    """The first dimension of the first tensor of a nested structure."""
    for _, leaf in operations.tree_leaves(data):
        if isinstance(leaf, torch.Tensor):
            return leaf.shape[0]
    raise ValueError(f"Can only find the batch size of tensors but got {type(data)}.")


def find_device(data: Any) -> Optional[torch.device]:
    """The device of the first tensor of a nested structure (None without any)."""
    for _, leaf in operations.tree_leaves(data):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return None


def listify(data: Any) -> Any:
    """Tensors (nested) as Python lists and numbers."""
    return recursively_apply(lambda tensor: tensor.tolist(), data)
