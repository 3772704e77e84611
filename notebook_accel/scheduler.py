"""``accelerate.scheduler``: ``AcceleratedScheduler`` (what ``prepare`` wraps an LR scheduler in)."""
from __future__ import annotations

from .accelerator.scheduler import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
