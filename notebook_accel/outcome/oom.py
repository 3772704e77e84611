"""Out of memory, explained in one line: which rank, what ran out, every rank's peak, what to try.

Three ways a rank runs out of memory, and how each is recognised:

* GPU: the rank raised torch's ``OutOfMemoryError`` ("CUDA out of memory. Tried to allocate ...").
* Host, gracefully: the rank raised ``MemoryError`` (an allocation failed, e.g. under ``RLIMIT_AS``), or
  torch's CPU allocator failed: a plain ``RuntimeError`` "DefaultCPUAllocator: can't allocate memory: you
  tried to allocate N bytes" (what ``torch.empty`` raises on CPU; torch 2.13 has no CPU OutOfMemoryError).
* Host, brutally: the kernel's OOM killer sent SIGKILL. A SIGKILL alone could be anything (a user's
  ``kill -9``), so it counts as OOM only when an OOM-kill counter went up during the launch: the cgroup's
  ``memory.events`` ``oom_kill`` (cgroup v2), ``memory.oom_control`` ``oom_kill`` (v1), else the machine's
  ``/proc/vmstat`` ``oom_kill``.

Example::

    before = oom_kill_count()
    ...   # the launch
    line = explain(kind_of_failure(event, exitcode, before), rank, peaks)
"""
from __future__ import annotations

import signal
from typing import Dict, List, Optional, Tuple

from ..formatting import format_bytes
from ..wire.events import RankFailed

# torch's CPU allocator (c10/core/impl/alloc_cpu.cpp) when malloc fails; raised as a plain RuntimeError.
CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"

# Where an OOM-kill counter may be read, most specific first (a test replaces this list with a fake file).
COUNTER_FILES: List[str] = []

ADVICE = {
    "gpu": "try a smaller batch size, gradient accumulation (Accelerator(gradient_accumulation_steps=N)), "
           "mixed_precision='bf16' (or 'fp16'), or activation checkpointing",
    "host": "try a smaller batch size, fewer DataLoader workers (each holds a copy of the dataset), fewer "
            "ranks, or loading data lazily instead of into memory",
}


def counter_files() -> List[str]:
    """Candidate files holding an ``oom_kill N`` line for this process's memory cgroup, then the machine's."""
    if COUNTER_FILES:
        return list(COUNTER_FILES)
    files = []
    try:
        with open("/proc/self/cgroup") as handle:
            entries = [line.strip().split(":", 2) for line in handle if line.count(":") >= 2]
    except OSError:
        entries = []
    for _id, controllers, path in entries:
        if controllers == "":  # cgroup v2 (unified)
            files += [f"/sys/fs/cgroup{path.rstrip('/')}/memory.events", "/sys/fs/cgroup/memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1; inside a container the mount is its own cgroup
            files += [f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control",
                      "/sys/fs/cgroup/memory/memory.oom_control"]
    return files + ["/proc/vmstat"]


def oom_kill_count() -> Optional[int]:
    """The first readable OOM-kill counter (see ``counter_files``), or None when none is readable."""
    for path in counter_files():
        try:
            with open(path) as handle:
                for line in handle:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kind_of_failure(event: Optional[RankFailed], exitcode: Optional[int],
                    oom_kills_before: Optional[int]) -> Optional[str]:
    """"gpu", "host", "host-allocator", "host-killed" when the failure was running out of memory, else None."""
    if event is not None:
        if event.exc_type.endswith("OutOfMemoryError") or "CUDA out of memory" in event.message:
            return "gpu"
        if event.exc_type == "builtins.MemoryError":
            return "host"
        if CPU_ALLOCATOR_FAILURE in event.message:
            return "host-allocator"
        return None
    if exitcode == -signal.SIGKILL and oom_kills_before is not None:
        now = oom_kill_count()
        if now is not None and now > oom_kills_before:
            return "host-killed"
    return None


def explain(kind: str, rank: int, peaks: Dict[int, Tuple[int, Optional[int]]]) -> str:
    """The one-line explanation, e.g. ``rank 1 ran out of GPU memory (CUDA out of memory); peak GPU memory
    per rank: rank 0: 7.9 GiB, rank 1: 8.0 GiB; try a smaller batch size, ...``."""
    device = kind == "gpu"
    what = {"gpu": "ran out of GPU memory (CUDA out of memory)",
            "host": "ran out of host memory (MemoryError)",
            "host-allocator": "ran out of host memory (torch's CPU allocator could not allocate)",
            "host-killed": "was killed by the out-of-memory killer (SIGKILL, the memory cgroup's oom_kill "
                           "count went up)"}[kind]
    figures = ", ".join(f"rank {r}: {format_bytes(dev if device else rss)}"
                        for r, (rss, dev) in sorted(peaks.items()) if (dev if device else rss))
    label = "peak GPU memory" if device else "peak host memory (RSS)"
    peak_text = f"; {label} per rank: {figures}" if figures else ""
    return f"rank {rank} {what}{peak_text}; {ADVICE['gpu' if device else 'host']}"
