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


# squeue's states (``--states=all``) of a job that will not run again: the job is over for us, as if not listed
OVER = {"completed", "cancelled", "failed", "timeout", "node_fail", "out_of_memory", "boot_fail", "deadline",
        "revoked", "special_exit"}
UNKNOWN = "unknown"   # squeue did not answer (slurmctld busy): not a reason to call the job lost


def state(folder: Any) -> Optional[str]:
    """``squeue``'s state of the job, lower case ("pending", "running", "requeued", "completing"...); None: the job is
    over or Slurm no longer knows it (ended, or never submitted); ``UNKNOWN`` when squeue itself failed (a busy
    controller times out). Asked with ``--states=all``, so that a job between two states of a requeue is listed."""
    job = folder.record().get("slurm_job")
    if job is None:
        return None
    listed = run_tool(["squeue", "-h", "-j", str(job), "--states=all", "-o", "%T"], timeout=30)
    if listed.returncode != 0:
        return None if "invalid job id" in listed.stderr.lower() else UNKNOWN
    words = listed.stdout.split()
    if not words or words[0].lower() in OVER:
        return None
    return words[0].lower()


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
