"""The driver of one array task of a sweep on Slurm: ``python -m notebook_accel.backends.slurm.array_task FOLDER``.

``sbatch --array`` runs it once per trial, inside that array task's own allocation (``SLURM_ARRAY_TASK_ID`` names
the trial). It reads the trial's plan from ``FOLDER/<task id>`` (``trial_folder``), runs it as any launch inside an
allocation runs — its ranks a step of this job (``backend.SlurmBackend``) —, writes every event of the launch to the
trial's ``events`` file and, at its end, the result or the root cause to its ``ending``. A ``scancel`` of the array
(the kernel's Stop or Ctrl-C) sends SIGTERM: the launch is stopped (its step cancelled) and the ending says so.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from typing import Any

from ...errors import LaunchError
from ...launcher import Launch
from ...wire.events import Status
from .trial_folder import Ending, TrialFolder


class FileView:
    """A launch's view that writes every event to the trial's ``events`` file."""

    def __init__(self, folder: TrialFolder) -> None:
        self.folder = folder

    def handle(self, event: Any) -> None:
        self.folder.append(event)

    def tick(self) -> None:
        pass


def run_trial(sweep_folder: str, task: str, job: str) -> Ending:
    """Run trial ``task`` of ``sweep_folder`` as a step of job ``job`` (this array task's); its ending, written."""
    started = time.time()
    folder = TrialFolder(os.path.join(sweep_folder, task))
    plan = folder.plan()
    # Planned in the kernel, outside any allocation: here it runs inside this array task's (no job asked for).
    plan = dataclasses.replace(plan, site=dataclasses.replace(plan.site, allocation=job, request=()))
    launch = Launch(plan, view=FileView(folder))
    ended_by_slurm = []

    def on_sigterm(*_: Any) -> None:
        ended_by_slurm.append(time.time())
        launch.stop()

    signal.signal(signal.SIGTERM, on_sigterm)
    launch.run_in_background()
    while not launch.done and not ended_by_slurm:   # short waits: SIGTERM's handler runs between them
        time.sleep(0.2)
    if ended_by_slurm:   # Slurm ends the job's steps itself and kills this driver seconds later: say so at once
        ending = Ending.raised(Status.STOPPED.value, started, LaunchError(
            f"Slurm ended array task {task} (job {job}) while its trial ran — a scancel, the time limit, or a "
            f"preemption — and its launch was stopped"))
    else:
        ending = Ending.of_launch(launch, started)
    folder.finish(ending)
    return ending


def main() -> int:
    ending = run_trial(sys.argv[1], os.environ["SLURM_ARRAY_TASK_ID"], os.environ["SLURM_JOB_ID"])
    print(f"notebook_accel: trial {os.environ['SLURM_ARRAY_TASK_ID']} {ending.status}"
          + (f": {ending.error_text}" if ending.error_text else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
