"""Imported once by the fork server (via ``set_forkserver_preload``), never by the kernel or a rank.

multiprocessing keeps the fork server's socket in the kernel's ``pymp-*`` temp dir and removes it only
when the kernel exits normally. When the kernel is killed, the fork server notices (its lifeline from the
kernel breaks) and exits; this module then removes the dir, so a killed kernel leaves no temp dir behind.
"""
from __future__ import annotations

import atexit
import os
import shutil
import time

from .fork_server_owner import KERNEL_TEMPDIR_VARIABLE

# How long the server waits, at its exit, to be re-parented before it takes the kernel for alive.
REPARENT_WAIT_S = 5.0


def _remove_if_orphaned(kernel_pid: int, tempdir: str, wait_s: float = REPARENT_WAIT_S) -> None:
    """Remove the kernel's temp dir once the server is re-parented: the kernel is gone.

    The server exits on its lifeline's EOF, which a dying kernel causes when the OS closes its files; the OS
    re-parents the kernel's children only after that. So a server that checked its parent once, at once, could
    still see the dying kernel and keep the dir (a CI run's leftover ``pymp-*``). Still the kernel's child after
    ``wait_s``: the kernel lives (it stopped its server itself) and the dir is its own to remove.
    """
    deadline = time.monotonic() + wait_s
    while os.getppid() == kernel_pid:
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)
    shutil.rmtree(tempdir, ignore_errors=True)


def _register() -> None:
    owner = os.environ.get(KERNEL_TEMPDIR_VARIABLE, "")
    pid, _, tempdir = owner.partition(":")
    if pid.isdigit() and int(pid) == os.getppid() and tempdir:
        # Ranks forked from the server leave with os._exit, so only the server itself runs this.
        atexit.register(_remove_if_orphaned, int(pid), tempdir)


_register()
