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

A GPU explanation carries the figures torch's caching allocator put in its message (``CudaOomFigures``): how much
the rank asked for, the card's total and free memory, and what the rank's process held then — the last one is
also a floor for that rank's peak, which a launch shorter than the kernel's one-second sampling would otherwise
know only from ``torch.cuda.max_memory_allocated`` (a few bytes, when the first large allocation is the one that
failed).

Example::

    before = oom_kill_count()
    ...   # the launch
    line = explain(kind_of_failure(event, exitcode, before), rank, peaks, cuda_oom_figures(event.message))
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass
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


_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
_UNITS = {"bytes": 1, "B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}
# torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp), torch 2.1 and later:
#   "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB of which 1.58 GiB is
#   free. [Process N has X memory in use. ]Including non-PyTorch memory, this process has 966.00 MiB memory in use.
#   Of the allocated memory 734.07 MiB is allocated by PyTorch, and 33.93 MiB is reserved by PyTorch but
#   unallocated. ..."
# and before 2.1: "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB
# already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) ..."
_PATTERNS = {
    "asked": rf"Tried to allocate {_SIZE}",
    "gpu": r"GPU ([0-9]+)(?: has a total capacity|;)",
    "total": rf"total capacity of {_SIZE}|{_SIZE} total capacity",
    "free": rf"of which {_SIZE} is free|already allocated; {_SIZE} free",
    "process_in_use": rf"this process has {_SIZE} memory in use",
    "allocated_by_torch": rf"{_SIZE} is allocated by PyTorch|{_SIZE} already allocated",
    "reserved_by_torch": rf"{_SIZE} reserved in total by PyTorch",
}


@dataclass(frozen=True)
class CudaOomFigures:
    """What torch's CUDA out-of-memory message says, in bytes (None where the message does not say it)."""

    asked: Optional[int] = None
    gpu: Optional[int] = None
    total: Optional[int] = None
    free: Optional[int] = None
    process_in_use: Optional[int] = None       # the rank's whole process, CUDA's own context included
    allocated_by_torch: Optional[int] = None
    reserved_by_torch: Optional[int] = None    # torch < 2.1's messages

    def text(self) -> str:
        """``asked for 400 GiB on GPU 0 (139.7 GiB in all, 138.9 GiB free; this process held 834 MiB, 512 B of
        it allocated by PyTorch)``, or "" when the message said none of it."""
        if self.asked is None and self.total is None:
            return ""
        where = f" on GPU {self.gpu}" if self.gpu is not None else ""
        card = [f"{format_bytes(value)} {label}" for value, label in ((self.total, "in all"), (self.free, "free"))
                if value is not None]
        held = ""
        if self.process_in_use is not None:
            held = f"this process held {format_bytes(self.process_in_use)}"
            if self.allocated_by_torch is not None:
                held += f", {format_bytes(self.allocated_by_torch)} of it allocated by PyTorch"
        elif self.allocated_by_torch is not None:
            held = f"{format_bytes(self.allocated_by_torch)} allocated by PyTorch"
        inside = "; ".join(part for part in (", ".join(card), held) if part)
        asked = f"asked for {format_bytes(self.asked)}" if self.asked is not None else "asked"
        return f"{asked}{where}" + (f" ({inside})" if inside else "")


def cuda_oom_figures(message: str) -> CudaOomFigures:
    """The figures in torch's CUDA out-of-memory ``message`` (any torch since 1.x; missing ones are None).

    >>> cuda_oom_figures("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
    ...                  "79.10 GiB of which 1.06 GiB is free.").asked == 2 * 2 ** 30
    True
    """
    found: Dict[str, Optional[int]] = {}
    for name, pattern in _PATTERNS.items():
        match = re.search(pattern, message)
        if match is None:
            found[name] = None
            continue
        groups = [group for group in match.groups() if group is not None]
        found[name] = int(groups[0]) if name == "gpu" else int(round(float(groups[0]) * _UNITS[groups[1]]))
    return CudaOomFigures(**found)


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


def explain(kind: str, rank: int, peaks: Dict[int, Tuple[int, Optional[int]]],
            figures: Optional[CudaOomFigures] = None) -> str:
    """The one-line explanation, e.g. ``rank 1 ran out of GPU memory (CUDA out of memory): asked for 2.0 GiB on GPU 1
    (79.1 GiB in all, 1.1 GiB free; this process held 78.0 GiB, ...); peak GPU memory per rank: rank 0: 7.9 GiB,
    rank 1: 78.0 GiB; try a smaller batch size, ...``. ``figures``: what torch's message said (a GPU failure)."""
    device = kind == "gpu"
    asked = figures.text() if device and figures is not None else ""
    if device and figures is not None and figures.process_in_use:
        # what the process held when it failed is a peak the samples may have missed (a short launch, in-kernel)
        rss, dev = peaks.get(rank, (0, None))
        peaks = {**peaks, rank: (rss, max(dev or 0, figures.process_in_use))}
    what = {"gpu": "ran out of GPU memory (CUDA out of memory)",
            "host": "ran out of host memory (MemoryError)",
            "host-allocator": "ran out of host memory (torch's CPU allocator could not allocate)",
            "host-killed": "was killed by the out-of-memory killer (SIGKILL, the memory cgroup's oom_kill "
                           "count went up)"}[kind]
    figures = ", ".join(f"rank {r}: {format_bytes(dev if device else rss)}"
                        for r, (rss, dev) in sorted(peaks.items()) if (dev if device else rss))
    label = "peak GPU memory" if device else "peak host memory (RSS)"
    peak_text = f"; {label} per rank: {figures}" if figures else ""
    return f"rank {rank} {what}{': ' + asked if asked else ''}{peak_text}; {ADVICE['gpu' if device else 'host']}"
