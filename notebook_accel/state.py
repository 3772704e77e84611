"""``accelerate.state``: ``PartialState``, ``AcceleratorState``, ``GradientState`` and ``DistributedType``.

``Accelerator().state`` is the ``AcceleratorState``; ``_reset_state()`` on either state lets a second Accelerator
be built with other settings, as HF's tests and notebooks do.
"""
from __future__ import annotations

from .accelerator.gradient_state import GradientState
from .accelerator.partial_state import AcceleratorState, PartialState
from .accelerator.state import DistributedType

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]


def is_initialized() -> bool:
    """Whether an ``AcceleratorState`` (an Accelerator) was made in this process."""
    return bool(AcceleratorState._shared_state)
