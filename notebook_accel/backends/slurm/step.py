"""One job step of ranks: the ``srun`` that starts them, relayed as any launcher whose stdio carries its tasks
(``relay.stream.StreamRelay``).

``srun`` starts one task per rank (``rank.slurm_task``) and forwards every task's stdout to its own, and its own stdin
to every task — Slurm's channel, authenticated by munge; nothing of ours listens on a port. What Slurm adds to the
relay is how ``srun`` tells of a task that ended without saying so itself (its stderr: "srun: error: n1: task 3:
Exited with exit code 2") and how a step is ended: ``scancel`` of the step (every task, on every node), then ``srun``.
"""
from __future__ import annotations

import re
import subprocess
import time
from typing import List, Optional

from ..relay.stream import StreamRelay
from .tools import run_tool

STEP_UNLISTED_WAIT = 10.0   # s, at most, for the controller to drop an ended step from ``squeue``

# A step of a real job: "412.0" (a test's stand-in launcher says "local.0", and no ``squeue`` knows it).
_SLURM_STEP_ID = re.compile(r"^(?P<job>\d+)\.\d+$")
# srun's own words when a task ended without saying so itself: "srun: error: n1: task 3: Exited with exit code 2",
# "srun: error: n1: tasks 0-1: Killed".
_TASK_ENDED = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<how>.*)$")


class SlurmStep(StreamRelay):
    """``srun`` running ``argv`` (one task per rank, ``world_size`` in all), relayed (see the module docstring)."""

    @property
    def step_id(self) -> Optional[str]:
        """``jobid.stepid`` once a task said it."""
        for hello in self.hellos.values():
            if not hello.step.endswith("?"):
                return hello.step
        return None

    def _launcher_said(self, line: str) -> None:
        ended = _TASK_ENDED.match(line)
        if ended:
            for rank in _task_ids(ended.group("tasks")):
                self.task_ended(rank, ended.group("how"))
        else:
            super()._launcher_said(line)

    def cancel(self) -> None:
        """End the step: ``scancel`` of it (every task, on every node), and of ``srun`` too (``srun`` ends its step
        on SIGTERM, also before it knew the step's id)."""
        step = self.step_id
        if step is not None:
            subprocess.run(["scancel", "--quiet", step], capture_output=True, timeout=30)
        super().cancel()

    def close(self) -> None:
        """``StreamRelay.close``, then until ``squeue`` no longer lists the step (``wait_until_unlisted``)."""
        super().close()
        step = self.step_id
        if step is not None:
            wait_until_unlisted(step)


def wait_until_unlisted(step: str, within: float = STEP_UNLISTED_WAIT) -> bool:
    """Until ``squeue`` no longer lists ``step`` (True), or ``within`` s (False).

    ``srun`` ends when its tasks have ended, but the controller drops the step from the queue only when each node's
    slurmd has told it so, a moment later: a launch that failed fast returned while ``squeue`` still listed its step
    (once in a full suite run). A launch returns when nothing of it is left, as Slurm shows it too. A step id that is
    not a real job's, or a ``squeue`` that cannot answer, ends the wait at once."""
    listed_job = _SLURM_STEP_ID.match(step)
    if listed_job is None:
        return True
    deadline = time.monotonic() + within
    while True:
        try:
            listed = run_tool(["squeue", "-h", "-s", "-j", listed_job.group("job"), "-o", "%i"], timeout=within)
        except (OSError, subprocess.SubprocessError):
            return True
        if listed.returncode != 0 or step not in listed.stdout.split():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _task_ids(text: str) -> List[int]:
    """srun's task list ("0-1,3") as numbers.

    >>> _task_ids("0-1,3")
    [0, 1, 3]
    """
    ids: List[int] = []
    for part in text.split(","):
        if "-" in part:
            first, last = part.split("-", 1)
            ids.extend(range(int(first), int(last) + 1))
        elif part:
            ids.append(int(part))
    return ids
