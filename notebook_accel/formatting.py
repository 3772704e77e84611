"""Values as text for people: numbers, byte counts, how a process ended. A leaf: imports nothing of ours,
so the rank side, the kernel side and the views can all use it."""
from __future__ import annotations

import math
import signal
from typing import Optional


def format_value(value: float) -> str:
    """A metric value in at most 4 significant digits: ``0.3127``, ``1.235e+05``, ``nan``."""
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


def format_bytes(value: Optional[float]) -> str:
    """``7.9 GiB``, ``512 MiB``: binary units, as torch's out-of-memory messages and nvidia-smi use."""
    if value is None:
        return "?"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}" if value / size < 100 else f"{value / size:.0f} {unit}"
    return f"{int(value)} B"


def count(number: int, noun: str) -> str:
    """``number`` of ``noun``, in the singular for one: ``1 restart``, ``0 runs``, ``2 ranks``.

    >>> count(1, "restart"), count(0, "run"), count(2, "rank")
    ('1 restart', '0 runs', '2 ranks')
    """
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def signal_name(exitcode: Optional[int]) -> Optional[str]:
    """The signal a process died of, from multiprocessing's exit code (-N for signal N): ``"SIGKILL"``.

    >>> signal_name(-9), signal_name(1)
    ('SIGKILL', None)
    """
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
