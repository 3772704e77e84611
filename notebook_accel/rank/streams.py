"""Writers on raw fds and flushing every layer of buffering: what both kinds of fd-level capture need
(a process rank's, ``rank/process.py``, and the in-kernel rank's, ``kernel_capture.py``)."""
from __future__ import annotations

import ctypes
import io
import sys

# The C library, loaded once where this module is imported (the kernel, whose forked ranks inherit it; the fork
# server): each ``ctypes.CDLL(None)`` builds new classes, a cost every rank would pay again.
try:
    libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no C library to load (Windows)
    libc = None


def line_writer(fd: int, encoding: str = "utf-8") -> io.TextIOWrapper:
    """A line-buffered text stream on ``fd`` that does not close it."""
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=encoding,
                            errors="backslashreplace", line_buffering=True)


def flush_std_streams() -> None:
    """Flush ``sys.stdout``/``sys.stderr`` and C stdio's buffers (printf output), ignoring closed streams."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        libc.fflush(None)
    except Exception:
        pass
