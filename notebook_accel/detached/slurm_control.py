"""A detached job's Slurm batch job, asked about and cancelled with Slurm's own commands (``squeue``, ``scancel``).

The job folder's ``record.json`` holds the batch job's id (``slurm_job``), written when ``sbatch`` answered.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from ..backends.slurm.tools import run_tool
from ..errors import LaunchError
from ..wire.events import Status
from .ending import Ending

CANCEL_GRACE = 20.0   # s the driver has, after scancel, to write its own "stopped" ending


def state(folder: Any) -> Optional[str]:
    """``squeue``'s state of the job, lower case ("pending", "running", "completing"...); None: Slurm no longer lists
    it (ended, or never submitted)."""
    job = folder.record().get("slurm_job")
    if job is None:
        return None
    listed = run_tool(["squeue", "-h", "-j", str(job), "-o", "%T"], timeout=30)
    words = listed.stdout.split()
    return words[0].lower() if listed.returncode == 0 and words else None


def cancel(folder: Any) -> None:
    """``scancel`` the batch job (its driver gets SIGTERM and writes the ending "stopped" if it can), then, once
    Slurm no longer lists it, write "stopped" if the driver could not."""
    job = folder.record().get("slurm_job")
    if job is not None:
        run_tool(["scancel", "--quiet", str(job)], timeout=30)
    deadline = time.monotonic() + CANCEL_GRACE
    while job is not None and state(folder) is not None:
        if time.monotonic() > deadline:
            raise LaunchError(f"scancel {job} did not end the detached job {folder.id} within {CANCEL_GRACE:g} s: "
                              f"squeue still lists it ({state(folder)})")
        time.sleep(0.5)
    if folder.ending() is None:
        folder.finish(Ending(Status.STOPPED.value, error_text=f"KeyboardInterrupt: the detached job {folder.id} "
                                                               f"was cancelled (Slurm job {job})"))
