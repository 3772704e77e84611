"""Local ranks as processes via multiprocessing: fork when safe, else a warm forkserver, else spawn."""
from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.util
import os
import signal
import warnings
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Dict, List, Optional

from ..forkserver_preload import KERNEL_TEMPDIR_VARIABLE
from ..plan import LaunchPlan
from ..worker import RankSpec, rank_main

_PIPE_BYTES = 1 << 20  # larger pipes: a chatty rank blocks less often while the kernel is busy drawing


@dataclass
class RankProcess:
    """A started rank: its process and the kernel's read ends of its stdout, stderr and event pipes."""

    rank: int
    process: multiprocessing.process.BaseProcess
    stdout_fd: int
    stderr_fd: int
    events_fd: int

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


class ProcessBackend:
    """Starts one process per rank with ``plan.start_method``; the supervisor does the rest."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.context = multiprocessing.get_context(plan.start_method)
        if plan.start_method == "forkserver":
            # The server imports torch once; every later rank is a cheap fork of a warm interpreter.
            self.context.set_forkserver_preload(["torch", "notebook_accel.worker",
                                                 "notebook_accel.forkserver_preload"])
            # Read by the server (it inherits the environment when it starts) to clean up after a killed kernel.
            os.environ[KERNEL_TEMPDIR_VARIABLE] = f"{os.getpid()}:{multiprocessing.util.get_temp_dir()}"
        self._lifeline_r, self._lifeline_w = os.pipe()

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        ranks: List[RankProcess] = []
        try:
            for rank in range(self.plan.world_size):
                ranks.append(self._start_rank(rank, rendezvous_env, ranks))
        except BaseException:  # e.g. Ctrl-C between two starts: the supervisor never saw these ranks
            for started in ranks:
                started.signal_group(signal.SIGKILL)
                started.process.join()
                for fd in (started.stdout_fd, started.stderr_fd, started.events_fd):
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

    def _start_rank(self, rank: int, rendezvous_env: Dict[str, str], started: List[RankProcess]) -> RankProcess:
        pipes = {name: _pipe() for name in ("stdout", "stderr", "events")}
        inherited: List[int] = []
        if self.plan.start_method == "fork":
            # A forked rank inherits every fd of the kernel; it must close the kernel's ends, or a pipe would
            # never reach EOF and the lifeline would never break.
            inherited = [self._lifeline_w] + [read for read, _ in pipes.values()]
            for other in started:
                inherited += [other.stdout_fd, other.stderr_fd, other.events_fd]
        spec = RankSpec(
            rank=self.plan.global_rank(rank), world_size=self.plan.global_world_size or self.plan.world_size,
            env=self.plan.rank_env(rank, rendezvous_env), payload=self.plan.payload,
            send_result=self.plan.sends_result(rank),
            stdout_fd=PassedFd(pipes["stdout"][1]),
            stderr_fd=PassedFd(pipes["stderr"][1]),
            events_fd=PassedFd(pipes["events"][1]),
            lifeline_fd=PassedFd(self._lifeline_r),
            inherited_fds=inherited,
        )
        process = self.context.Process(target=rank_main, args=(spec,), name=f"notebook_accel-rank-{rank}")
        try:
            with warnings.catch_warnings():
                # Python >= 3.12 warns on fork in a multi-threaded process (every Jupyter kernel); the rank
                # replaces what it inherited from those threads (streams, signal handlers) first thing.
                warnings.simplefilter("ignore", DeprecationWarning)
                process.start()
        finally:
            for _, write in pipes.values():
                os.close(write)  # the kernel keeps only read ends: EOF once the rank is gone
        return RankProcess(spec.rank, process, pipes["stdout"][0], pipes["stderr"][0], pipes["events"][0])


class PassedFd:
    """An fd handed to a rank: a forked rank inherits it as is; for spawn and forkserver, pickling it asks
    multiprocessing to duplicate it into the child (the same mechanism that passes a ``Connection``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _rebuild_passed_fd, (reduction.DupFd(self.fd),)


def _rebuild_passed_fd(duplicated) -> PassedFd:
    return PassedFd(duplicated.detach())


def _pipe():
    read, write = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        try:
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:  # over /proc/sys/fs/pipe-max-size for unprivileged users
            pass
    return read, write


def signal_name(exitcode: Optional[int]) -> Optional[str]:
    """multiprocessing reports death by signal N as exitcode -N."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
