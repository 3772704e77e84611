"""What the kernel and its fork server share about the server, importable by the kernel.

``forkserver_preload`` registers its clean-up when it is imported, so only the fork server may import it. A kernel
that imported it (for this name, or for ``probe``) while its own parent kernel had a fork server registered that
clean-up in itself: it then waited out the clean-up's wait for re-parenting (5 s) at every exit.
"""
from __future__ import annotations

KERNEL_TEMPDIR_VARIABLE = "NOTEBOOK_ACCEL_FORKSERVER_OWNER"  # "<kernel pid>:<its multiprocessing temp dir>"


def probe() -> None:
    """A process forked from the server and gone at once: how a kernel learns that its fork server is warm
    (``backends.processes.warm_start``)."""
