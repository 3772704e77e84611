"""A warm session's ranks on Slurm (``Session(cluster="slurm")``): one job step that stays up across runs and cells.

``SessionSlurmStep`` is ``base.WarmRanks`` on a Slurm allocation, as ``ray.session.SessionRayActors`` is on a Ray
cluster, so ``Session`` and its rules (``backends.session``) apply unchanged. Underneath: the job (the kernel's
allocation, or one asked for — named ``notebook_accel:session`` — and held until ``kill``: at ``close()``, at the
kernel's exit, or when the start is interrupted), one ``srun`` step whose tasks run ``RankActor.serve``
(``rank.slurm_task``), and the step's relay carrying their events into the pipes the supervisors read. A command (a run, an interrupt, a new group) goes to
its rank through ``srun``'s stdin; a process group is cut by each rank closing the connections its own join made
(its peers' pids are on other machines).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...errors import LaunchError
from ...plan.plan import LaunchPlan
from ...wire.commands import BreakGroup, Command, RunFunction
from ...wire.events import RankStarted
from ...wire.payload import PortablePayload
from ..base import WarmRanks
from .backend import SlurmBackend, srun_command, srun_environment
from .step import SlurmRankProcess, SlurmStep


class _StepCommandSender:
    """``CommandSender``'s surface for one Slurm rank: the command to its task, through ``srun``'s stdin."""

    def __init__(self, ranks: "SessionSlurmStep", rank: int) -> None:
        self.ranks = ranks
        self.rank = rank

    def send(self, command: Command, fds: Optional[List[int]] = None) -> None:
        step = self.ranks.step
        if isinstance(command, BreakGroup):  # pids of other machines mean nothing there: cut what the join made
            command = BreakGroup(peer_pids=None, kernel_pid=0)
        if step is None or not step.send(command, self.rank):
            raise OSError("the session's ranks are gone")

    def close(self) -> None:
        pass


class SessionSlurmStep(WarmRanks):
    """The ranks of ``Session(cluster="slurm")``: see the module docstring."""

    name = "session-slurm"
    ranks_are_threads = True  # a task runs the rank in a thread of its own process: interrupted by a command

    def __init__(self, plan: LaunchPlan, group_backend: Optional[str], group_generation: int) -> None:
        self.plan = plan
        self.group_backend = group_backend
        self.group_generation = group_generation
        self.backend = SlurmBackend(plan)
        self.step: Optional[SlurmStep] = None
        self.handles: List[SlurmRankProcess] = []
        self.commands: Dict[int, _StepCommandSender] = {}
        self.pids: Dict[int, int] = {}

    @classmethod
    def open_store(cls, plan: LaunchPlan) -> Any:
        """Refuse what cannot run before anything waits (rank 0 hosts the store)."""
        return SlurmBackend(plan).open_rendezvous()

    @classmethod
    def function_task(cls, function: Callable[..., Any], args: tuple, kwargs: Dict[str, Any],
                      return_all: bool) -> Tuple[RunFunction, List[int], Callable[[], None]]:
        payload = PortablePayload.create(function, args, kwargs, into_rank_namespace=True)
        command = RunFunction(task_id=0, data=payload.data, storages=payload.storages, buffers=payload.buffers,
                              shared_sizes=[], return_all=return_all, blobs=payload.blobs)
        return command, [], lambda: None

    def start(self, rendezvous_env: Dict[str, str]) -> List[SlurmRankProcess]:
        """The job (waited for), the step, every task serving (joining the group is the session's first task).
        Whatever ends the start early — Ctrl-C while the job pends in the queue, a step that cannot start — gives
        back what was asked of Slurm before it is raised."""
        try:
            return self._start()
        except BaseException:
            self.kill()
            raise

    def _start(self) -> List[SlurmRankProcess]:
        never = lambda: False  # noqa: E731  (Ctrl-C ends the wait; Session bounds the rest by its first task's timeout)
        self.backend.open_rendezvous()
        job = self.backend.allocate(never, lambda: None,
                                    lambda text: print(f"notebook_accel: {text}", file=sys.stderr, flush=True),
                                    session=True)
        self.step = step = SlurmStep(srun_command(self.plan, job, session=True), self.plan.world_size,
                                     env=srun_environment(self.plan))
        try:
            step.wait_ready(never, lambda: None)
        except RuntimeError as error:
            raise LaunchError(f"the session's Slurm job step did not start: {error}") from None
        self.handles = step.attach()
        step.send(("run", self.backend.setup(step, serve=True, group_backend=self.group_backend,
                                             group_generation=self.group_generation)))
        self.commands = {rank: _StepCommandSender(self, rank) for rank in range(self.plan.world_size)}
        for handle in self.handles:  # what is typed at a rank's prompt goes with its commands, in order
            handle.answers = self.commands[handle.rank]
        self.pids = {rank: hello.pid for rank, hello in step.hellos.items()}
        return list(self.handles)

    def started_event(self, rank: int) -> RankStarted:
        hello = self.step.hellos.get(rank) if self.step is not None else None
        return RankStarted(rank=rank, pid=self.pids[rank], host=hello.node if hello else None,
                           reports_resources=True)

    def kill(self) -> None:
        """End the step now (``scancel``), give the job back if it was asked for, close the kernel's ends."""
        step, self.step = self.step, None
        if step is not None:
            if step.srun.poll() is None:
                step.cancel()
            step.close()
        self.backend.release()
        for handle in self.handles:
            handle.process.join(5.0)
            handle.close_fds()
        self.handles = []

    def close(self) -> None:
        pass
