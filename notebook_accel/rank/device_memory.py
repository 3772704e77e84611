"""Inside a rank: tell the kernel what the framework knows about device memory, cheaply.

``torch.cuda.max_memory_allocated()`` is a counter read (no device sync), so sending it with the progress
and metric events a rank sends anyway — at most once a second — costs nothing measurable. Nothing is sent
until the rank has initialized CUDA (a CPU rank never imports anything for it). On TPU, torch_xla's
``get_memory_info`` gives used and total bytes (when the installed torch_xla has it).

Example (what ``progress`` and ``report`` do)::

    maybe_send_device_memory(sender)          # throttled
    maybe_send_device_memory(sender, force=True)   # a failing rank: its peak at the moment of failure
"""
from __future__ import annotations

import sys
import time
from typing import Any, Optional

from ..wire.events import DeviceMemoryReport, PeakMemoryReport

INTERVAL = 1.0
_sent_at = 0.0


def device_memory_report(rank: int) -> Optional[DeviceMemoryReport]:
    """The rank's device memory figures, or None when it uses no device (never initializes one)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is not None and cuda.is_initialized():
            return DeviceMemoryReport(rank=rank, peak_allocated=int(cuda.max_memory_allocated()),
                                      peak_reserved=int(cuda.max_memory_reserved()))
    except Exception:
        pass
    xla_model = sys.modules.get("torch_xla.core.xla_model")
    if xla_model is not None and hasattr(xla_model, "get_memory_info"):
        try:  # not exercised in this repository's tests (no TPU here)
            info = xla_model.get_memory_info(xla_model.xla_device())
            used = info.get("bytes_used", info.get("kb_total", 0) * 1024 - info.get("kb_free", 0) * 1024)
            total = info.get("bytes_limit", info.get("kb_total", 0) * 1024) or None
            return DeviceMemoryReport(rank=rank, used=int(used), total=total, source="torch_xla")
        except Exception:
            return None
    return None


def maybe_send_device_memory(sender: Any, force: bool = False) -> None:
    """Send a ``DeviceMemoryReport`` if a second has passed since the last one (or ``force``)."""
    global _sent_at
    now = time.monotonic()
    if not force and now - _sent_at < INTERVAL:
        return
    _sent_at = now
    report = device_memory_report(sender.rank)
    if report is not None:
        try:
            sender.send(report)
        except (OSError, ValueError):
            pass


def send_peak_rss(sender: Any) -> None:
    """Tell the kernel this process's peak RSS (``getrusage``: KiB on Linux, bytes on macOS); nothing where the
    OS has no ``resource`` module. Called by a rank process (or TPU device thread) when its function ended."""
    try:
        import resource
    except ImportError:  # Windows
        return
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sender.send(PeakMemoryReport(rank=sender.rank, peak_rss=peak if sys.platform == "darwin" else peak * 1024))
