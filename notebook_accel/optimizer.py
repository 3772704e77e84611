"""``accelerate.optimizer``: ``AcceleratedOptimizer`` (what ``prepare`` wraps an optimizer in)."""
from __future__ import annotations

from .accelerator.optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
