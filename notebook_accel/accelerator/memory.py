"""What a rank holds of a sharded model: parameters, gradients and optimizer state, in bytes.

Under FSDP2 a parameter is a DTensor (``to_local()`` is this rank's shard); under DeepSpeed ZeRO-3 a
parameter's data is emptied and this rank's partition is ``ds_tensor``. The Accelerator prints one line of
these figures per rank after the first optimizer step (when gradients and optimizer state exist), so the
dashboard's output shows sharding working: each rank holding about 1/N.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Callable, Dict, Optional

import torch

from ..formatting import format_bytes

__all__ = ["held_bytes", "memory_line", "release_freed_memory"]


def _nbytes(tensor: Any) -> int:
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _parameter_bytes(param: torch.nn.Parameter) -> "tuple[int, int]":
    """(bytes this rank holds, bytes of the whole parameter)."""
    if hasattr(param, "ds_tensor"):  # DeepSpeed ZeRO-3
        return _nbytes(param.ds_tensor), param.ds_numel * param.ds_tensor.element_size()
    return _nbytes(param), param.numel() * param.element_size()


def _optimizer_state_bytes(optimizer: Optional[torch.optim.Optimizer]) -> int:
    if optimizer is None:
        return 0
    return sum(_nbytes(value) for state in optimizer.state.values() for value in state.values()
               if isinstance(value, torch.Tensor) and value.dim() > 0)  # fmt: skip


def held_bytes(
    model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, gradients: bool = True
) -> Dict[str, Optional[int]]:
    """This rank's bytes of parameters (and of the whole model), gradients (None: not measured, e.g. DeepSpeed
    keeps them in its own buckets and frees them in its step) and optimizer state."""
    held = whole = 0
    for param in model.parameters():
        mine, total = _parameter_bytes(param)
        held, whole = held + mine, whole + total
    return {
        "parameters": held,
        "whole_parameters": whole,
        "gradients": sum(_nbytes(param.grad) for param in model.parameters()) if gradients else None,
        "optimizer": _optimizer_state_bytes(optimizer),
    }


def memory_line(how: str, world: int, figures: Dict[str, Optional[int]]) -> str:
    """One line for the rank's output, e.g. 'FSDP2 over 2 ranks: this rank holds parameters 1.2 MiB of 2.4 MiB…'."""
    gradients = "" if figures["gradients"] is None else f", gradients {format_bytes(figures['gradients'])}"
    return (
        f"notebook_accel: {how} over {world} ranks: this rank holds parameters "
        f"{format_bytes(figures['parameters'])} of {format_bytes(figures['whole_parameters'])}{gradients}, "
        f"optimizer state {format_bytes(figures['optimizer'])}"
    )


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # glibc's
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    glibc keeps freed blocks of a few MB in its heap, and smaller long-lived blocks allocated next are carved out
    of them, so the next large block no longer fits and the heap grows: freed memory stays resident. Sharding
    makes that pattern at a few moments — a parameter made whole, its rows kept and the rest freed (init_module);
    whole layers gathered and freed (the first backward), before the optimizer state is allocated (the first
    step) — so a rank trims then: its resident memory stays near what it holds (a few ms each)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
