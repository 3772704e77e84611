"""The driver of a detached launch on Slurm: the batch job's script runs ``python -m notebook_accel.detached.slurm_driver
<folder>`` on the job's first node. It runs the launch as a kernel inside an allocation does — the ranks a step of
this batch job (``srun --jobid``) — with the recording view writing every event to the job folder, then the ending.

Time limits and preemption: the ranks get Slurm's ``--signal=USR2@N`` (and, in a detached job, SIGTERM: a preemption
or ``scontrol requeue`` from outside, ``KillWait`` seconds before SIGKILL) as the warning; they agree on a step, save
the checkpoint there and raise ``TimeLimitReached``. The driver then records that the job is requeued and requeues it
(``scontrol requeue``): Slurm starts it again (``SLURM_RESTART_COUNT`` > 0), this driver appends to the same log (an
``AttemptStarted`` in place of the second ``LaunchStarted``) and runs the function again, which resumes from
``accelerator.latest_checkpoint``. The ``LaunchFinished`` of an attempt that is requeued is not recorded: an attached
dashboard sees one launch, with a restart. A job cancelled (``scancel``) records the ending "stopped" at once.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, List, Optional

from ..backends.slurm.tools import run_tool
from ..errors import TimeLimitReached, one_line
from ..launcher import Launch
from ..plan.plan import make_plan
from ..rank.time_warning import DETACHED_VARIABLE
from ..views import TextView
from ..wire.events import AttemptStarted, LaunchFinished, LaunchStarted, RankEvent, SessionNotice, Status
from .ending import Ending
from .folder import JobFolder
from .recording import RecordingView

REQUEUE_WAIT = 120.0   # s the driver waits, after asking for the requeue, for Slurm to end it


class AttemptLog:
    """The folder as the launch's sink across requeues: a restarted job's ``LaunchStarted`` becomes an
    ``AttemptStarted``; the ``LaunchFinished`` is held until the driver knows the job is not requeued."""

    def __init__(self, folder: JobFolder, restart: int, previous: List[str]) -> None:
        self.folder = folder
        self.restart = restart
        self.previous = previous
        self.finished: Optional[LaunchFinished] = None

    def append(self, event: RankEvent) -> None:
        if isinstance(event, LaunchStarted) and self.restart > 0:
            event = AttemptStarted(rank=-1, attempt=self.restart, max_restarts=self.restart,
                                   previous_errors=list(self.previous))
        if isinstance(event, LaunchFinished):
            self.finished = event
            return
        self.folder.append(event)

    def finish(self, ending: Ending) -> None:
        if self.finished is not None:
            self.folder.append(self.finished)
        self.folder.finish(ending)


class Termination:
    """Slurm's SIGTERM to the driver: the job is cancelled (the ending "stopped" is written at once: SIGKILL follows
    ``KillWait`` seconds later), or preempted / requeued (said in the log; the ranks checkpoint, the job runs again)."""

    def __init__(self, folder: JobFolder, job: str) -> None:
        self.folder = folder
        self.job = job
        self.ended = False        # cancelled, or out of time: the ending is written
        self.preempted = False    # requeued from outside (a preemption, ``scontrol requeue``): it runs again
        self.requeueing = False   # the driver itself asked for the requeue
        self.started = time.monotonic()
        signal.signal(signal.SIGTERM, self._on_term)
        # ``scancel --signal=USR2 --full`` (or --batch) would end the driver by USR2's default action: the warning is
        # the ranks' (they are a step of their own), the driver has nothing to do with it
        signal.signal(signal.SIGUSR2, lambda signum, frame: None)

    def _on_term(self, signum: int, frame: Any) -> None:
        if self.requeueing:
            os._exit(0)
        state = job_state(self.job)
        ending = ENDED_BY.get(state or "")
        if ending is not None:
            status, why = ending
            self.ended = True
            self.folder.append(SessionNotice(rank=-1, text=f"the Slurm job {self.job} {why}"))
            self.folder.finish(Ending(status, elapsed=time.monotonic() - self.started,
                                      error_text=f"the detached job {self.folder.id} {why} (Slurm job {self.job})"))
        else:
            self.preempted = True
            self.folder.append(SessionNotice(rank=-1, text=f"Slurm is ending job {self.job} ({state or 'preempted'}): "
                                                           "the ranks checkpoint at their next agreed step; the job "
                                                           "runs again from there"))


# Slurm's JobState when its SIGTERM means the job will not run again: how the detached launch ended, and why.
ENDED_BY = {"CANCELLED": (Status.STOPPED.value, "was cancelled"),
            "TIMEOUT": (Status.TIMEOUT.value, "reached its time limit before the ranks saved a checkpoint")}


def job_state(job: str) -> Optional[str]:
    """``scontrol show job``'s JobState of ``job`` (CANCELLED, RUNNING, REQUEUED...)."""
    shown = run_tool(["scontrol", "show", "job", "-o", job], timeout=10)
    fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
    return fields.get("JobState")


def main(path: str) -> int:
    folder = JobFolder(path)
    job = os.environ.get("SLURM_JOB_ID", "?")
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    os.environ[DETACHED_VARIABLE] = "1"   # srun exports it to the ranks: SIGTERM is a warning there
    termination = Termination(folder, job)
    record = folder.record()
    sink = AttemptLog(folder, restart, record.get("attempt_errors", []))
    before = float(record.get("elapsed", 0.0))
    try:
        driver_plan = folder.read_plan()
        function, args, kwargs = driver_plan.payload.load()
        plan = make_plan(function, args, kwargs, driver_plan.options, allow_inline=False)
    except BaseException as error:   # the job cannot run here (a module the nodes lack, a refused option)
        sink.finish(Ending.raised(Status.FAILED.value, error, before + time.monotonic() - termination.started))
        return 1
    launch = Launch(plan, view=RecordingView(sink, also=TextView()))
    try:
        launch.run()
    except BaseException:   # the outcome is the launch's (``launch.error``)
        pass
    elapsed = before + time.monotonic() - termination.started
    if termination.ended:
        return 0
    if termination.preempted or isinstance(launch.error, TimeLimitReached):
        said = one_line(launch.error) if launch.error is not None else "preempted"
        folder.update_record(elapsed=elapsed, attempt_errors=record.get("attempt_errors", []) + [said])
    if termination.preempted:   # Slurm requeues it already
        return 0
    if isinstance(launch.error, TimeLimitReached):
        folder.append(SessionNotice(rank=-1, text=f"{said}; the Slurm job {job} is requeued: the function runs again "
                                                   f"and resumes from the checkpoint"))
        termination.requeueing = True
        asked = run_tool(["scontrol", "requeue", job], timeout=30)
        if asked.returncode == 0:
            time.sleep(REQUEUE_WAIT)   # Slurm ends this script (SIGTERM) as it requeues the job
            return 0
        folder.append(SessionNotice(rank=-1, text=f"scontrol requeue {job} failed: {asked.stderr.strip()}"))
    sink.finish(Ending.of_launch(launch, elapsed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
