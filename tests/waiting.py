"""Wait for a condition instead of sleeping a fixed time (a shared 2-core machine may be slow at any moment).

Usable in the test process and inside a rank (the module has no test-only imports)::

    wait_until(lambda: job.status == "running", timeout=60, what="the ranks to start")
    wait_for_file(go_file)            # in a rank: the test writes the file when it has seen what it needs
"""
from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 60.0, what: str = "the condition",
               interval: float = 0.05) -> T:
    """Call ``condition`` until it returns something true, and return that; AssertionError after ``timeout`` s.

    ``timeout`` only catches a hang: pass a generous one, never one that measures speed.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(interval)


def wait_for_file(path: str, timeout: float = 120.0) -> None:
    """Block until ``path`` exists (a rank waiting for the test's go-ahead)."""
    wait_until(lambda: os.path.exists(path), timeout, what=path)
