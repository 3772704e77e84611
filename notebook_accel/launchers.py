"""``accelerate.launchers``: ``notebook_launcher`` and ``debug_launcher``."""
from __future__ import annotations

from typing import Any, Callable

from .launcher import notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher"]


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` on ``num_processes`` CPU processes (HF's, for debugging a distributed loop on a
    machine without GPUs): ``notebook_launcher(function, args, num_processes=num_processes, device="cpu")``."""
    notebook_launcher(function, args, num_processes=num_processes, device="cpu")
