"""Local ranks as processes via multiprocessing: fork when safe, else a warm forkserver, else spawn.

``ProcessBackend.run`` is the whole sequence: start one process per rank with its pipes (a ``RankProcess``
handle each), hand them to the ``Supervisor`` (``backends.supervisor``) until every rank is gone, and close the
lifeline so nothing can outlive the launch.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import warnings
from typing import Dict, List, Optional

from ...outcome.root_cause import Outcome
from ...plan.plan import LaunchPlan
from ...rank.process import RankSpec, rank_main
from ...wire.fds import PassedFd, make_pipe
from ..base import Backend, LaunchSink, StopPolicy
from ..supervisor import RankProcess, Supervisor
from .starting import configure_fork_server, ensure_fork_server, starting_rank_process


class ProcessBackend(Backend):
    """One process per rank, started with ``plan.start_method``; the supervisor reads them to the end."""

    name = "processes"
    # What a rank process runs, and the spec it gets: a warm session's ranks (``backends.session``) differ here.
    spec_class = RankSpec
    rank_target = staticmethod(rank_main)

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        self.context = multiprocessing.get_context(plan.start_method)
        if plan.start_method == "forkserver":
            configure_fork_server(self.context)  # what the server preloads, from the kernel's copy
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._supervisor: Optional[Supervisor] = None
        self._handles: List[RankProcess] = []

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._handles = self.start(rendezvous_env)

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        self._supervisor = Supervisor(
            self._handles, sink.deliver, sink.tick, policy=policy,
            expect_results=lambda rank: self.plan.sends_result(rank - self.plan.rank_offset))
        return self._supervisor.run()

    def _close(self) -> None:
        self.close()

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self._supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        """Start a process per rank; its handle, by rank."""
        handles: List[RankProcess] = []
        try:
            if self.plan.start_method == "forkserver":
                ensure_fork_server()
            for rank in range(self.plan.world_size):
                handles.append(self._start_rank(rank, rendezvous_env, handles))
        except BaseException:  # e.g. Ctrl-C between two starts: the supervisor never saw these ranks
            for started in handles:
                started.signal_group(signal.SIGKILL)
                started.process.join()
                started.close_fds()
            raise
        finally:
            os.close(self._lifeline_r)  # only the ranks hold the read end now
        return handles

    def close(self) -> None:
        """The launch is over: closing the lifeline makes any rank still alive kill itself."""
        if self._lifeline_w >= 0:
            os.close(self._lifeline_w)
            self._lifeline_w = -1
        self.plan.payload.close()

    def _spec_extras(self, rank: int) -> Dict[str, object]:
        """More fields for ``spec_class``'s spec of ``rank`` (none for a launch's rank)."""
        return {}

    def _inherited_fds(self, rank: int) -> List[int]:
        """More kernel fds a *forked* ``rank`` inherits and must close (none for a launch's rank)."""
        return []

    def _start_rank(self, rank: int, rendezvous_env: Dict[str, str], started: List[RankProcess]) -> RankProcess:
        pipes = {name: make_pipe() for name in ("stdout", "stderr", "events", "stacks")}
        inherited: List[int] = []
        if self.plan.start_method == "fork":
            # A forked rank inherits every fd of the kernel; it must close the kernel's ends, or a pipe would
            # never reach EOF and the lifeline would never break.
            inherited = [self._lifeline_w] + [read for read, _ in pipes.values()]
            for other in started:
                inherited += other.fds
            inherited += self._inherited_fds(rank)
        plan = self.plan
        spec = self.spec_class(
            rank=plan.global_rank(rank), world_size=plan.global_world_size or plan.world_size,
            env={**plan.kernel_env, **plan.rank_env(rank, rendezvous_env)},
            cwd=plan.kernel_cwd, sys_path=plan.kernel_sys_path,
            # fork: the kernel's own objects, inherited; otherwise pickled once, large data in shared memory
            payload=plan.payload if plan.start_method == "fork" else plan.payload.pickled(),
            send_result=plan.sends_result(rank),
            stdout_fd=PassedFd(pipes["stdout"][1]),
            stderr_fd=PassedFd(pipes["stderr"][1]),
            events_fd=PassedFd(pipes["events"][1]),
            stacks_fd=PassedFd(pipes["stacks"][1]),
            lifeline_fd=PassedFd(self._lifeline_r),
            inherited_fds=inherited,
            **self._spec_extras(rank),
        )
        process = self.context.Process(target=self.rank_target, args=(spec,), name=f"notebook_accel-rank-{rank}")
        try:
            with warnings.catch_warnings(), starting_rank_process():
                # Python >= 3.12 warns on fork in a multi-threaded process (every Jupyter kernel); the rank
                # replaces what it inherited from those threads (streams, signal handlers) first thing.
                warnings.simplefilter("ignore", DeprecationWarning)
                process.start()
        finally:
            for _, write in pipes.values():
                os.close(write)  # the kernel keeps only read ends: EOF once the rank is gone
        return RankProcess(spec.rank, process, pipes["stdout"][0], pipes["stderr"][0], pipes["events"][0],
                           pipes["stacks"][0])

