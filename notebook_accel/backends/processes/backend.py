"""Local ranks as processes via multiprocessing: fork when safe, else a warm forkserver, else spawn.

``ProcessBackend.run`` is the whole sequence: start one process per rank with its pipes, hand them to the
``Supervisor`` until every rank is gone, and close the lifeline so nothing can outlive the launch.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import spawn
from typing import Dict, Iterator, List

from ...outcome.root_cause import Outcome
from ...plan.plan import LaunchPlan
from ...rank.forkserver_preload import KERNEL_TEMPDIR_VARIABLE
from ...rank.process import RankSpec, rank_main
from ...wire.fds import PassedFd, make_pipe
from ..base import Backend, LaunchSink, StopPolicy
from .supervisor import Supervisor


@dataclass
class RankProcess:
    """A started rank: its process and the kernel's read ends of its stdout, stderr and event pipes."""

    rank: int
    process: multiprocessing.process.BaseProcess
    stdout_fd: int
    stderr_fd: int
    events_fd: int
    stacks_fd: int   # faulthandler writes the rank's Python stacks here on SIGUSR1 (``Launch.dump_stacks``)

    @property
    def fds(self) -> List[int]:
        return [self.stdout_fd, self.stderr_fd, self.events_fd, self.stacks_fd]

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal_group(self, sig: int) -> None:
        """Signal the rank and everything it started (it leads its own process group)."""
        try:
            os.killpg(self.pid, sig)
            return
        except (ProcessLookupError, PermissionError):  # not yet its own group leader, or already gone
            pass
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass


class ProcessBackend(Backend):
    """One process per rank, started with ``plan.start_method``; the supervisor reads them to the end."""

    name = "processes"

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        self.context = multiprocessing.get_context(plan.start_method)
        if plan.start_method == "forkserver":
            # The server imports torch once; every later rank is a cheap fork of a warm interpreter.
            # Everything a rank imports (rank.process imports the rank side; the payload comes unpickled).
            self.context.set_forkserver_preload(["torch", "notebook_accel.rank.process", "notebook_accel.wire.payload",
                                                 "notebook_accel.rank.forkserver_preload"])
            # Read by the server (it inherits the environment when it starts) to clean up after a killed kernel.
            os.environ[KERNEL_TEMPDIR_VARIABLE] = f"{os.getpid()}:{multiprocessing.util.get_temp_dir()}"
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._supervisor = None
        self._ranks: List[RankProcess] = []

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._ranks = self.start(rendezvous_env)

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        self._supervisor = Supervisor(
            self._ranks, sink.deliver, sink.tick, policy=policy,
            expect_results=lambda rank: self.plan.sends_result(rank - self.plan.rank_offset))
        return self._supervisor.run()

    def _close(self) -> None:
        self.close()

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self._supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        ranks: List[RankProcess] = []
        try:
            for rank in range(self.plan.world_size):
                ranks.append(self._start_rank(rank, rendezvous_env, ranks))
        except BaseException:  # e.g. Ctrl-C between two starts: the supervisor never saw these ranks
            for started in ranks:
                started.signal_group(signal.SIGKILL)
                started.process.join()
                for fd in started.fds:
                    os.close(fd)
            raise
        finally:
            os.close(self._lifeline_r)  # only the ranks hold the read end now
        return ranks

    def close(self) -> None:
        """The launch is over: closing the lifeline makes any rank still alive kill itself."""
        if self._lifeline_w >= 0:
            os.close(self._lifeline_w)
            self._lifeline_w = -1
        self.plan.payload.close()

    def _start_rank(self, rank: int, rendezvous_env: Dict[str, str], started: List[RankProcess]) -> RankProcess:
        pipes = {name: make_pipe() for name in ("stdout", "stderr", "events", "stacks")}
        inherited: List[int] = []
        if self.plan.start_method == "fork":
            # A forked rank inherits every fd of the kernel; it must close the kernel's ends, or a pipe would
            # never reach EOF and the lifeline would never break.
            inherited = [self._lifeline_w] + [read for read, _ in pipes.values()]
            for other in started:
                inherited += other.fds
        plan = self.plan
        spec = RankSpec(
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
        )
        process = self.context.Process(target=rank_main, args=(spec,), name=f"notebook_accel-rank-{rank}")
        try:
            with warnings.catch_warnings(), main_not_rerun():
                # Python >= 3.12 warns on fork in a multi-threaded process (every Jupyter kernel); the rank
                # replaces what it inherited from those threads (streams, signal handlers) first thing.
                warnings.simplefilter("ignore", DeprecationWarning)
                process.start()
        finally:
            for _, write in pipes.values():
                os.close(write)  # the kernel keeps only read ends: EOF once the rank is gone
        return RankProcess(spec.rank, process, pipes["stdout"][0], pipes["stderr"][0], pipes["events"][0],
                           pipes["stacks"][0])


_skip_main = threading.local()


@contextmanager
def main_not_rerun() -> Iterator[None]:
    """Start forkserver/spawn children without re-running the launching script's ``__main__``.

    multiprocessing makes such a child import the parent's main script (as ``__mp_main__``) so that
    functions pickled by reference resolve; a script that calls ``notebook_launcher`` without an
    ``if __name__ == "__main__":`` guard would then launch again in every rank and die with
    multiprocessing's bootstrap error. Our ranks never need it: the function travels by value
    (cloudpickle). Only this thread's starts are affected.
    """
    _install_preparation_filter()
    _skip_main.active = True
    try:
        yield
    finally:
        _skip_main.active = False


def _install_preparation_filter() -> None:
    if getattr(spawn.get_preparation_data, "_notebook_accel", False):
        return
    original = spawn.get_preparation_data

    def get_preparation_data(name):
        data = original(name)
        if getattr(_skip_main, "active", False):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._notebook_accel = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data
