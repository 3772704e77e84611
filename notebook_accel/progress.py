"""Progress bars inside ranks (placeholder until the dashboard issue lands: plain tqdm, no reporting)."""
from __future__ import annotations

from typing import Callable

from tqdm.auto import tqdm as progress  # noqa: F401


def patch_tqdm() -> Callable[[], None]:
    """Make tqdm report to the kernel inside a rank; returns a function that undoes the patch."""
    return lambda: None
