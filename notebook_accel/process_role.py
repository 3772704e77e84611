"""Which kind of process this is, from what costs nothing to read: the package's import asks it before it starts
anything in the background (``notebook_accel/__init__.py``), and so does the warm start (``backends.processes
.warm_start``). A leaf module: it imports nothing of the package, and nothing heavy.

A *kernel process* may start ranks: not a rank (torchrun's ``RANK`` / ``LOCAL_RANK`` set), not a child that
multiprocessing started, not multiprocessing's fork server. The fork server is told by its command line
(``python -c "from multiprocessing.forkserver import main; ..."``), not by an inherited variable: the kernel's
environment reaches every child of the kernel — a script run from a cell, a test's subprocess — and none of those
is its fork server.

>>> is_fork_server(["python", "-B", "-c", "from multiprocessing.forkserver import main; main(3, 5, [], **{})"])
True
>>> is_fork_server(["python", "train.py"])
False
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

SWITCH = "NOTEBOOK_ACCEL_WARM_START"
_FORK_SERVER_MAIN = "from multiprocessing.forkserver import main"


def warm_start_switched_off() -> bool:
    """``NOTEBOOK_ACCEL_WARM_START=0`` (or false, no, off)."""
    return os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def is_fork_server(command_line: Optional[Sequence[str]] = None) -> bool:
    """Whether this process is multiprocessing's fork server (``command_line``: this process's, read from /proc;
    where there is no /proc, the ``-c`` command cannot be seen and the answer is False)."""
    if command_line is None:
        try:
            with open("/proc/self/cmdline", "rb") as listed:
                command_line = listed.read().decode("utf-8", "replace").split("\0")
        except OSError:
            return False
    return any(argument.startswith(_FORK_SERVER_MAIN) for argument in command_line)


def is_kernel_process() -> bool:
    """Not a rank, not a multiprocessing child, not the fork server: a process that may start ranks."""
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return False
    multiprocessing = sys.modules.get("multiprocessing")  # a child of multiprocessing imported it first
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        return False
    return not is_fork_server()
