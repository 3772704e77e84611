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
from typing import List, Optional

from ..relay.stream import StreamRelay

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
