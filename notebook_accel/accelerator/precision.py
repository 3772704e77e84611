"""Mixed precision: which dtype, the autocast context, the fp16 GradScaler, and fp32 outputs.

``"bf16"`` needs no loss scaling (bf16 has fp32's exponent range) and runs on CPU, CUDA and TPU.
``"fp16"`` needs a :class:`torch.amp.GradScaler` so small gradients do not underflow; it is a CUDA feature
here: on CPU bf16 is the choice (fp16 on CPU is slow and gains nothing), and we say so instead of guessing.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, ContextManager, Mapping, Optional

import torch

from ..wire.choices import MixedPrecision
from .operations import tree_map

__all__ = [
    "PRECISIONS",
    "resolve_mixed_precision",
    "check_precision_supported",
    "autocast_dtype",
    "autocast_context",
    "make_grad_scaler",
    "AutocastForward",
]

PRECISIONS = MixedPrecision.values()
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_mixed_precision(value: Optional[str], environ: Optional[Mapping[str, str]] = None) -> str:
    """The precision to use: ``value`` if given, else the launcher's ``ACCELERATE_MIXED_PRECISION``, else "no".

    Example::

        resolve_mixed_precision(None, {"ACCELERATE_MIXED_PRECISION": "bf16"})   # -> "bf16"
    """
    environ = os.environ if environ is None else environ
    chosen = value if value is not None else environ.get("ACCELERATE_MIXED_PRECISION", "no")
    chosen = str(chosen).strip().lower() or "no"
    if chosen not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {chosen!r}")
    return chosen


def check_precision_supported(mixed_precision: str, device: torch.device) -> None:
    """Raise a clear error for a precision this device cannot train in."""
    if mixed_precision == "fp16" and device.type != "cuda":
        raise ValueError(
            f"mixed_precision='fp16' needs a CUDA device (it relies on a GradScaler), but this process runs on "
            f"{device.type!r}. On CPU (and TPU) use mixed_precision='bf16'."
        )
    if mixed_precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("mixed_precision='bf16' is not supported by this CUDA device; use 'fp16'.")


def autocast_dtype(mixed_precision: str) -> Optional[torch.dtype]:
    """The autocast dtype for a precision, or None for full precision."""
    return _DTYPES.get(mixed_precision)


def autocast_context(device: torch.device, mixed_precision: str, enabled: bool = True) -> ContextManager[Any]:
    """``torch.autocast`` for this device and precision, or a no-op context for "no" / ``enabled=False``."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None or not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(mixed_precision: str, device: torch.device) -> Optional["torch.amp.GradScaler"]:
    """A GradScaler for fp16 on CUDA; None otherwise (bf16 and fp32 need no loss scaling)."""
    if mixed_precision != "fp16":
        return None
    if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        return torch.amp.GradScaler(device.type)
    return torch.cuda.amp.GradScaler()


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class AutocastForward:
    """Replaces a module's ``forward`` so the unchanged training loop runs under autocast.

    Outputs come back in fp32, so the loss (computed outside ``forward``) is taken in full precision,
    which is what autocast's own recipe asks for. A class rather than a closure so it can be recognized
    (and removed) by :meth:`Accelerator.unwrap_model`.
    """

    def __init__(self, forward: Callable[..., Any], device_type: str, dtype: torch.dtype) -> None:
        self.original_forward = forward
        self.device_type = device_type
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            outputs = self.original_forward(*args, **kwargs)
        return tree_map(_to_fp32, outputs)


class LowPrecisionForward(AutocastForward):
    """For a model whose weights are already bf16/fp16 (DeepSpeed converts them): floating-point inputs are
    cast to that dtype instead of autocasting (autocast would run e.g. layer_norm in fp32 against bf16
    weights, which torch refuses); outputs still come back in fp32."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        def cast(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(self.dtype) if tensor.is_floating_point() else tensor

        outputs = self.original_forward(*tree_map(cast, args), **tree_map(cast, kwargs))
        return tree_map(_to_fp32, outputs)


def add_low_precision_forward(module: torch.nn.Module, mixed_precision: str) -> None:
    """Cast inputs to the low-precision dtype of ``module``'s weights from now on (no-op for "no")."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None or isinstance(module.__dict__.get("forward"), AutocastForward):
        return
    module.forward = LowPrecisionForward(module.forward, "", dtype)


def add_autocast_to_forward(module: torch.nn.Module, device: torch.device, mixed_precision: str) -> None:
    """Run ``module.forward`` under autocast from now on (no-op for "no" or when already done)."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None or isinstance(module.__dict__.get("forward"), AutocastForward):
        return
    module.forward = AutocastForward(module.forward, device.type, dtype)


def remove_autocast_from_forward(module: torch.nn.Module) -> None:
    """Undo :func:`add_autocast_to_forward` in place."""
    patched = module.__dict__.get("forward")
    if isinstance(patched, AutocastForward):
        del module.forward
        original = patched.original_forward
        # unless the original was itself an instance attribute (someone patched before us): put it back
        if getattr(original, "__func__", None) is not type(module).forward:
            module.forward = original
