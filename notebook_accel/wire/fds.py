"""Pipe ends handed from the kernel to a rank process, whatever its start method.

A forked rank inherits the kernel's fds as they are; a spawn or fork-server rank gets duplicates, made by
multiprocessing when the ``PassedFd`` is pickled (the mechanism that passes a ``Connection``).
"""
from __future__ import annotations

import array
import os
from multiprocessing import reduction
from typing import Any, Tuple

try:
    import fcntl
    import termios
except ImportError:  # Windows
    fcntl = termios = None  # type: ignore[assignment]

PIPE_BYTES = 1 << 20  # larger pipes: a chatty rank blocks less often while the kernel is busy drawing


class PassedFd:
    """An fd handed to a rank: a forked rank inherits it as is; for spawn and forkserver, pickling it asks
    multiprocessing to duplicate it into the child."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _rebuild_passed_fd, (reduction.DupFd(self.fd),)


def _rebuild_passed_fd(duplicated) -> PassedFd:
    return PassedFd(duplicated.detach())


def take_fd(passed: Any) -> int:
    """The fd number behind a ``PassedFd`` (or a plain int)."""
    return passed if isinstance(passed, int) else passed.fd


def make_pipe() -> Tuple[int, int]:
    """``(read, write)`` of a new pipe, enlarged to ``PIPE_BYTES`` where the OS allows it."""
    read, write = os.pipe()
    if fcntl is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
        try:
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # over /proc/sys/fs/pipe-max-size for unprivileged users
            pass
    return read, write


def pending_bytes(fd: int) -> int:
    """How many bytes wait in the pipe ``fd`` (0 where the OS cannot say)."""
    if fcntl is None or not hasattr(termios, "FIONREAD"):
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 0
    return count[0]
