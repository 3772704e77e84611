"""Pipe ends handed from the kernel to a rank process, whatever its start method.

A forked rank inherits the kernel's fds as they are; a spawn or fork-server rank gets duplicates, made by
multiprocessing when the ``PassedFd`` is pickled (the mechanism that passes a ``Connection``).
"""
from __future__ import annotations

import array
import os
import socket
from multiprocessing import reduction
from typing import Any, Dict, Tuple

try:
    import fcntl
    import termios
except ImportError:  # Windows
    fcntl = termios = None  # type: ignore[assignment]

PIPE_BYTES = 1 << 20  # larger pipes: a chatty rank blocks less often while the kernel is busy drawing
RANK_STREAMS = ("stdout", "stderr", "events", "stacks")


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


def event_channel() -> Tuple[int, int]:
    """``(kernel end, rank end)`` of a rank's event channel: a connected pair of Unix stream sockets (a pipe
    cannot carry the shared-memory files a result sends beside it), buffered like a pipe."""
    kernel, rank = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for end in (kernel, rank):
        try:
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BYTES)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BYTES)
        except OSError:  # over the system's limit: its default size then
            pass
    return kernel.detach(), rank.detach()


def rank_pipes() -> Dict[str, Tuple[int, int]]:
    """A new rank's streams, each ``(kernel end, rank end)``: stdout, stderr and stacks pipes, the event channel."""
    return {name: event_channel() if name == "events" else make_pipe() for name in RANK_STREAMS}


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
