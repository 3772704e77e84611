"""``accelerate.tracking``: ``GeneralTracker`` (subclass it for a tracker of one's own) and the built-in ones' base."""
from __future__ import annotations

from .accelerator.tracking import GeneralTracker

__all__ = ["GeneralTracker"]
