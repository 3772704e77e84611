"""A warm session's ranks on Slurm (``Session(cluster="slurm")``): one job step that stays up across runs and cells.

``SessionSlurmStep`` is ``relay.RelayedWarmRanks`` on a Slurm allocation, as ``ray.session.SessionRayActors`` is on a
Ray cluster, so ``Session`` and its rules (``backends.session``) apply unchanged. Underneath: the job (the kernel's
allocation, or one asked for — named ``notebook_accel:session`` — and held until ``kill``: at ``close()``, at the
kernel's exit, or when the start is interrupted), one ``srun`` step whose tasks run ``RankActor.serve``
(``rank.slurm_task``), and the step's relay carrying their events into the pipes the supervisors read. A command (a
run, an interrupt, a new group) goes to its rank through ``srun``'s stdin.
"""
from __future__ import annotations

import sys
from typing import List, Optional

from ...errors import LaunchError
from ..relay import RelayedWarmRanks
from ..supervisor import RankProcess
from .backend import SlurmBackend


class SessionSlurmStep(RelayedWarmRanks):
    """The ranks of ``Session(cluster="slurm")``: see the module docstring."""

    name = "session-slurm"
    backend_class = SlurmBackend
    backend: SlurmBackend

    def _start_world(self) -> List[RankProcess]:
        """The job (waited for), the step, every task serving (joining the group is the session's first task)."""
        never = lambda: False  # noqa: E731  (Ctrl-C ends the wait; Session bounds the rest by its first task's timeout)
        self.backend.open_rendezvous()
        job = self.backend.allocate(never, lambda: None,
                                    lambda text: print(f"notebook_accel: {text}", file=sys.stderr, flush=True),
                                    session=True)
        step = self.backend.start_step(job, session=True)
        try:
            step.wait_ready(never, lambda: None)
        except RuntimeError as error:
            raise LaunchError(f"the session's Slurm job step did not start: {error}") from None
        handles = step.attach()
        step.send(("run", self.backend.setup(step, serve=True, group_backend=self.group_backend,
                                             group_generation=self.group_generation)))
        return list(handles)

    def node_of(self, rank: int) -> Optional[str]:
        step = self.backend.world
        hello = step.hellos.get(rank) if step is not None else None
        return hello.node if hello is not None else None

    def _end_world(self) -> None:
        """End the step now (``scancel``), give the job back if it was asked for."""
        step, self.backend.world = self.backend.world, None
        if step is not None:
            if step.launcher.poll() is None:
                step.cancel()
            step.close()
        self.backend.release()
