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
import os
from typing import Any, Callable, Dict, Mapping, Optional

import torch

from ..formatting import format_bytes

__all__ = ["held_bytes", "memory_line", "release_freed_memory", "return_large_blocks_when_freed"]


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
def _glibc(name: str) -> Optional[Callable[..., int]]:
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return None


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_VARIABLE = "NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB"
DEFAULT_MMAP_THRESHOLD_MIB = 4


def return_large_blocks_when_freed(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """Have glibc give every block of 4 MiB or more back to the system as soon as it is freed (``mallopt``'s
    ``M_MMAP_THRESHOLD``); the threshold set, in bytes, or None where nothing was changed.

    A sharded CPU rank frees and allocates blocks of a few MB all the time (FSDP2's gathered layers, ZeRO-3's
    gathered parameters, their gradients, the optimizer's temporaries). glibc serves a freed mmap-ed block's size
    from its heap from then on (its threshold follows the largest block freed, up to 32 MiB), and that heap keeps
    freed memory resident and fragments: a rank's RSS then grows step after step (ZeRO-3 on bench_sharded's 100M
    model: +1.1 GiB over 4 steps) — the memory sharding was chosen to save. Above a fixed threshold each block is
    mapped and unmapped by itself: peak memory follows what the rank holds, at the cost of the system zeroing the
    pages of each new block (step time measured in docs/accelerator.md). Set ``NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB``
    to another size, or 0 to leave glibc as it is; glibc's own ``MALLOC_MMAP_THRESHOLD_`` in the environment
    (where the user chose) is left alone."""
    environ = os.environ if environ is None else environ
    if "MALLOC_MMAP_THRESHOLD_" in environ:
        return None
    text = environ.get(MMAP_THRESHOLD_VARIABLE, "").strip()
    try:
        mib = float(text) if text else DEFAULT_MMAP_THRESHOLD_MIB
    except ValueError:
        raise ValueError(f"{MMAP_THRESHOLD_VARIABLE}={text!r}: give a size in MiB (0 leaves glibc's default)") from None
    mallopt = _glibc("mallopt")
    if mib <= 0 or mallopt is None:
        return None
    threshold = int(mib * 2**20)
    return threshold if mallopt(_M_MMAP_THRESHOLD, threshold) == 1 else None  # glibc refuses above 32 MiB


def release_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    glibc keeps freed blocks of a few MB in its heap, and smaller long-lived blocks allocated next are carved out
    of them, so the next large block no longer fits and the heap grows: freed memory stays resident. Sharding
    makes that pattern at a few moments — a parameter made whole, its rows kept and the rest freed (init_module);
    whole layers gathered and freed (the first backward), before the optimizer state is allocated (the first
    step) — so a rank trims then: its resident memory stays near what it holds (a few ms each)."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)
