"""Imported once by the fork server (via ``set_forkserver_preload``), never by the kernel or a rank.

multiprocessing keeps the fork server's socket in the kernel's ``pymp-*`` temp dir and removes it only
when the kernel exits normally. When the kernel is killed, the fork server notices (its lifeline from the
kernel breaks) and exits; this module then removes the dir, so a killed kernel leaves no temp dir behind.
"""
from __future__ import annotations

import atexit
import os
import shutil

KERNEL_TEMPDIR_VARIABLE = "NOTEBOOK_ACCEL_FORKSERVER_OWNER"  # "<kernel pid>:<its multiprocessing temp dir>"


def _remove_if_orphaned(kernel_pid: int, tempdir: str) -> None:
    if os.getppid() != kernel_pid:  # re-parented: the kernel is gone
        shutil.rmtree(tempdir, ignore_errors=True)


def _register() -> None:
    owner = os.environ.get(KERNEL_TEMPDIR_VARIABLE, "")
    pid, _, tempdir = owner.partition(":")
    if pid.isdigit() and int(pid) == os.getppid() and tempdir:
        # Ranks forked from the server leave with os._exit, so only the server itself runs this.
        atexit.register(_remove_if_orphaned, int(pid), tempdir)


def probe() -> None:
    """A process forked from the server and gone at once: how a kernel learns that its fork server is warm
    (``backends.processes.warm_start``)."""


_register()
