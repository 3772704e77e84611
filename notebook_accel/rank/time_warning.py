"""The warning a rank gets before its job ends: SIGUSR2 (Slurm's ``--signal=USR2@N``, ``scancel --signal=USR2``).

The handler only raises a flag of this process; ``accelerator/time_limit.py`` makes the ranks agree on it. It is
installed as soon as a rank's process starts (``rank/process.py``, ``rank/slurm_task.py``): SIGUSR2's default
action ends a process, and the warning may come before the user's function built its Accelerator.
"""
from __future__ import annotations

import signal
import threading
from typing import Any

WARNING_SIGNAL = signal.SIGUSR2
# Set in a detached launch's ranks (``detached.slurm_driver``): there SIGTERM is Slurm ending the job — a preemption,
# ``scontrol requeue`` — not the launcher stopping a rank, and it is a warning too (``KillWait`` s before SIGKILL).
DETACHED_VARIABLE = "NOTEBOOK_ACCEL_DETACHED"

_warned = threading.Event()
_installed = False


def _on_warning(signum: int, frame: Any, previous: Any = None) -> None:
    _warned.set()
    if callable(previous):  # a handler the user's code installed before ours still runs
        previous(signum, frame)


def install_warning_handler(fresh: bool = False) -> bool:
    """Catch :data:`WARNING_SIGNAL` in this process (once; it raises the flag :func:`was_warned` reads).
    False where Python cannot install a handler (not the main thread: a rank that is a thread of the kernel).
    ``fresh``: the first call of a new rank process."""
    global _installed
    if fresh:  # a new rank process: a flag or a handler inherited from the process it was forked from is not its own
        _warned.clear()
        _installed = False
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(WARNING_SIGNAL)
    chained = previous if callable(previous) and previous is not _on_warning else None
    signal.signal(WARNING_SIGNAL, lambda signum, frame: _on_warning(signum, frame, chained))
    _installed = True
    return True


def was_warned() -> bool:
    """True once this process received the warning signal (or :func:`warn` was called)."""
    return _warned.is_set()


def warn() -> None:
    """Raise this process's flag as the signal does (for code that learns of the time limit another way)."""
    _warned.set()


def install_termination_warning() -> bool:
    """In a detached launch's rank (``DETACHED_VARIABLE`` set): SIGTERM raises the same flag as the warning signal,
    so that a preempted job's ranks save their checkpoint at the next agreed step while Slurm's ``KillWait`` lasts.
    False elsewhere (SIGTERM keeps its default: how the launcher stops a rank)."""
    import os

    if not os.environ.get(DETACHED_VARIABLE) or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, lambda signum, frame: _warned.set())
    return True
