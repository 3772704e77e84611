"""Kernel side of a warm session: its rank processes, and one task on them supervised like a launch.

``SessionProcesses`` starts the ranks once with the process backend's machinery (fork, forkserver, spawn; the
same pipes, lifeline and set-up) plus a command socket each. ``SessionRunBackend`` is the ``Backend`` a
``Launch`` runs for each ``Session.run`` or ``%%ranks`` cell: it sends the task and supervises the ranks until
every one is idle again — the same events, root-cause rule, Stop, timeout and stack dumps as a launch — with
``SessionSupervisor``, which interrupts busy ranks instead of ending them and cuts a process group left half
way through a collective.
"""
from __future__ import annotations

import os
import select
import selectors
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set

from ..outcome.root_cause import Outcome, is_interrupt
from ..plan.plan import LaunchPlan
from ..rank.session import SessionRankSpec, session_rank_main
from ..wire.commands import BreakGroup, Command, CommandSender, Interrupt, session_socketpair
from ..wire.events import RankEvent, RankFailed, RankStarted, Status, TaskDone
from ..wire.fds import PassedFd
from .base import Backend, LaunchSink, StopPolicy
from .processes.backend import ProcessBackend, RankProcess
from .prompts import Asker
from .processes.supervisor import TICK_SECONDS, Supervisor
from .xla.backend import XlaBackend

BREAK_GROUP_AFTER = 0.3   # s an interrupted rank may take to leave Python code before its collectives are cut


class _SessionRanks:
    """What a session's ranks have beyond a launch's, whatever starts them: a command socket each (the rank's
    end handed over as it starts, the kernel's kept), the pid each rank runs in, and ``kill``."""

    ranks_are_threads = False  # TPU ranks are device threads: interrupted by a command, not by SIGINT
    answers_own_socket = False  # a prompt's answer comes on the rank's command socket
    plan: LaunchPlan

    def _open_sessions(self, group_backend: Optional[str], group_generation: int) -> None:
        self.group_backend = group_backend
        self.group_generation = group_generation
        self.sockets = {rank: session_socketpair() for rank in range(self.plan.world_size)}
        self.commands: Dict[int, CommandSender] = {}
        self.started: List[RankProcess] = []
        self.pids: Dict[int, int] = {}     # where each rank runs, as its RankStarted said
        self.closed_fds: Set[int] = set()  # kernel read ends a supervisor closed at EOF (a rank that died)

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        try:
            ranks = super().start(rendezvous_env)  # type: ignore[misc]
        finally:
            for _, rank_end in self.sockets.values():  # only the ranks hold their ends now
                rank_end.close()
        self.commands = {rank: CommandSender(kernel) for rank, (kernel, _) in self.sockets.items()}
        for handle in ranks:  # what is typed at a rank's prompt goes on its command socket
            handle.answers = self.commands[handle.rank]
        self.started = ranks
        self.pids = {handle.rank: handle.pid for handle in ranks}
        return ranks

    def kill(self) -> None:
        """End every rank now (SIGKILL to each rank's process group), reap it, close the kernel's ends."""
        for handle in self.started:
            handle.signal_group(signal.SIGKILL)
        for handle in self.started:
            handle.process.join(5.0)
            for fd in handle.fds:
                if fd not in self.closed_fds:
                    self.closed_fds.add(fd)
                    os.close(fd)
        self.started = []
        self.close()

    def close(self) -> None:
        for sender in self.commands.values():
            sender.close()
        for kernel, _ in self.sockets.values():
            kernel.close()
        super().close()  # type: ignore[misc]


class SessionProcesses(_SessionRanks, ProcessBackend):
    """The session's rank processes: a launch's, plus each rank's end of a command socket."""

    name = "session"
    spec_class = SessionRankSpec
    rank_target = staticmethod(session_rank_main)

    def __init__(self, plan: LaunchPlan, group_backend: Optional[str], group_generation: int) -> None:
        ProcessBackend.__init__(self, plan)
        self._open_sessions(group_backend, group_generation)

    def _spec_extras(self, rank: int) -> Dict[str, object]:
        return {"command_fd": PassedFd(self.sockets[rank][1].fileno()), "group_backend": self.group_backend,
                "group_generation": self.group_generation}

    def _inherited_fds(self, rank: int) -> List[int]:
        kernel_ends = [kernel.fileno() for kernel, _ in self.sockets.values()]
        others = [own.fileno() for other, (_, own) in self.sockets.items() if other != rank]
        return kernel_ends + others


class SessionXlaHost(_SessionRanks, XlaBackend):
    """A TPU session: the launch's XLA host, whose device threads serve tasks from their command sockets
    instead of running one function — workers, device threads and their compiled graphs stay up."""

    name = "session-xla"
    ranks_are_threads = True

    def __init__(self, plan: LaunchPlan, group_backend: Optional[str], group_generation: int) -> None:
        XlaBackend.__init__(self, plan)
        self._open_sessions(None, group_generation)  # XLA's collectives need no torch.distributed group

    def _host_spec_extras(self) -> Dict[str, object]:
        return {"command_fds": [PassedFd(rank_end.fileno()) for _, rank_end in self.sockets.values()]}


class SessionSupervisor(Supervisor):
    """Supervises one task on warm ranks until each is idle again (``TaskDone``) or gone.

    Where a launch's supervisor ends ranks (SIGTERM, then SIGKILL), this one interrupts the busy ones (SIGINT:
    ``KeyboardInterrupt`` in the task, the rank stays), and after ``BREAK_GROUP_AFTER`` seconds cuts the process
    group's connections, so a rank blocked in a collective its peer left gets an error. A rank still busy
    ``recover_timeout`` seconds after that is beyond reach: every rank is killed and ``gave_up`` says why (the
    session then starts afresh). A rank this supervisor interrupted is stopped, as a launch's ranks it ends are:
    its ``KeyboardInterrupt`` is not a failure of its own.
    """

    # A supervisor per task, over the same fds: poll(2) registers them without a system call each (epoll's
    # registration is most of a warm run's cost in the kernel).
    selector_class = selectors.PollSelector

    def __init__(self, ranks: List[RankProcess], deliver: Callable[[RankEvent], None], tick: Callable[[], None],
                 *, policy: StopPolicy, expect_results: Callable[[int], bool], task_id: int,
                 recover_timeout: float, processes: Any, asker: Optional[Asker] = None) -> None:
        super().__init__(ranks, deliver, tick, policy=policy, expect_results=expect_results, asker=asker)
        self.task_id = task_id
        self.recover_timeout = recover_timeout
        self.processes = processes
        self.commands = processes.commands
        self.idle: Set[int] = set()
        self.sequences: Dict[int, Optional[int]] = {}
        self.broke_group = False
        self.gave_up: Optional[str] = None
        self.shadowed: Set[str] = set()  # kernel names the ranks have their own of (``TaskDone.shadowed``)
        self._interrupted_at: Optional[float] = None
        for rank, state in self.ranks.items():
            state.started = True  # they said so when the session started: their stack dumps are armed
            state.pid = processes.pids.get(rank, state.pid)  # a TPU rank runs in a worker, not in the host

    # ------------------------------------------------------------------------------------------- progress

    def _close_fd(self, state: Any, fd: int) -> None:
        self.processes.closed_fds.add(fd)  # the session closes the rest when it ends
        super()._close_fd(state, fd)

    def _finished(self) -> bool:
        return all(rank in self.idle or state.exited_at is not None for rank, state in self.ranks.items())

    def settled(self) -> bool:
        """Every rank is idle again or gone: the task is over."""
        return self._finished()

    def busy(self) -> List[int]:
        return sorted(rank for rank, state in self.ranks.items() if rank not in self.idle and state.exited_at is None)

    def lost(self) -> List[int]:
        return sorted(rank for rank, state in self.ranks.items() if state.exited_at is not None)

    def _on_event(self, state: Any, event: RankEvent) -> None:
        if isinstance(event, TaskDone):
            if event.task_id == self.task_id:
                self.idle.add(event.rank)
                self.sequences[event.rank] = event.group_sequence
                self.shadowed.update(event.shadowed)
                self.desk.withdraw(event.rank)
                self._post_mortem_over(event.rank)
            return
        if isinstance(event, RankFailed) and is_interrupt(event) and state.stopped_by_us:
            state.failed = event  # our own interrupt: the view shows the rank stopped when the run ends
            self.desk.withdraw(event.rank)
            return
        if isinstance(event, RankStarted):  # a rank says it once, when the session starts
            state.pid = self.processes.pids[event.rank] = event.pid
        super()._on_event(state, event)

    def _drain(self) -> None:
        """Every rank flushed its output before saying it was done: read what is still in the pipes."""
        for state in self.ranks.values():
            while True:
                ready = [fd for fd in state.open_fds if select.select([fd], [], [], 0)[0]]
                if not ready:
                    break
                for fd in ready:
                    if fd in state.open_fds:
                        self._read(state, fd)

    # ------------------------------------------------------------------------------------------- stopping

    def _stop(self, status: Status) -> None:
        """Interrupt the busy ranks; the idle ones wait for the next task."""
        self.status = status
        self.still_running = self.busy()
        for rank in self.still_running:
            self.ranks[rank].stopped_by_us = True
            if self.processes.ranks_are_threads:  # a device thread: its reader thread raises in it
                send_quietly(self.commands[rank], Interrupt(task_id=self.task_id))
                continue
            try:
                os.kill(self.ranks[rank].pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        self._interrupted_at = time.monotonic()

    def _decide(self, policy: Optional[StopPolicy]) -> None:
        super()._decide(policy)
        if self._interrupted_at is None or self._finished():
            return
        waited = time.monotonic() - self._interrupted_at
        if waited >= BREAK_GROUP_AFTER and not self.broke_group:
            self.break_group()
        if waited >= BREAK_GROUP_AFTER + self.recover_timeout and self.gave_up is None:
            stuck = ", ".join(str(rank) for rank in self.busy())
            self.gave_up = (f"rank {stuck} did not stop within {self.recover_timeout:g} s "
                            f"(recover_timeout); it may be stuck in a C++ call or collective")
            self._signal_alive(signal.SIGKILL)

    def break_group(self) -> None:
        """Tell every live rank to cut its process group's connections to the others (its reader thread does it
        at once, also while its main thread is blocked in a collective)."""
        self.broke_group = True
        pids = {rank: state.pid for rank, state in self.ranks.items() if state.exited_at is None}
        for rank in pids:
            peers = [pid for other, pid in pids.items() if other != rank]
            send_quietly(self.commands[rank], BreakGroup(peer_pids=peers, kernel_pid=os.getpid()))

    def _emergency_stop(self) -> None:
        """Ctrl-C in the kernel: interrupt the run on every rank and wait for them to be idle (a second Ctrl-C
        meanwhile is ignored); past the bound, kill them all (the session restarts)."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGINT) if main else None
        if previous is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self._interrupted_at is None:
                self._stop(Status.STOPPED)
            self.status = Status.STOPPED
            while not self._finished() and self.gave_up is None:
                self._poll(TICK_SECONDS)
                self._decide(None)
            end = time.monotonic() + 1.0
            while not self._finished() and time.monotonic() < end:  # the killed ranks' exits
                self._poll(TICK_SECONDS)
            self._drain()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


class _SessionStore:
    """The session's store, as a launch's backend hands it out: hosted for the session's life, not per run."""

    def __init__(self, env: Dict[str, str]) -> None:
        self._env = env

    def env(self) -> Dict[str, str]:
        return self._env

    def close(self) -> None:
        pass


class SessionRunBackend(Backend):
    """One task on the session's warm ranks, as a ``Launch`` runs a backend: send, supervise until idle,
    then let the session mend what the task left broken (``after``)."""

    name = "session"
    job = "run"

    def __init__(self, plan: LaunchPlan, *, processes: Any, ranks: List[RankProcess],
                 task_id: int, command: Command, fds: List[int], recover_timeout: float,
                 after: Callable[["SessionSupervisor", Callable[[RankEvent], None]], None]) -> None:
        super().__init__(plan)
        self.processes = processes
        self.ranks = ranks
        self.task_id = task_id
        self.command = command
        self.fds = fds
        self.recover_timeout = recover_timeout
        self.after = after
        self.supervisor: Optional[SessionSupervisor] = None
        self._deliver: Callable[[RankEvent], None] = lambda event: None

    def open_rendezvous(self) -> Any:
        return _SessionStore({})

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._deliver = sink.deliver
        if hasattr(self.command, "no_one_types"):  # the task's prompts: answered here, or skipped (and why)
            self.command.no_one_types = sink.asker.absent  # type: ignore[attr-defined]
        for handle in self.ranks:  # the rows of this run's dashboard: each rank is there, and running
            sink.deliver(RankStarted(rank=handle.rank, pid=self.processes.pids.get(handle.rank, handle.pid)))
        for handle in self.ranks:  # a rank already gone is the supervisor's to report
            send_quietly(self.processes.commands[handle.rank], self.command, self.fds)

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        self.supervisor = SessionSupervisor(
            self.ranks, sink.deliver, sink.tick, policy=policy,
            expect_results=lambda rank: self.plan.sends_result(rank), task_id=self.task_id,
            recover_timeout=self.recover_timeout, processes=self.processes, asker=sink.asker)
        return self.supervisor.run()

    def _close(self) -> None:
        if self.supervisor is not None:
            self.after(self.supervisor, self._deliver)

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self.supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}


def send_quietly(sender: CommandSender, command: Command, fds: Optional[List[int]] = None) -> None:
    """Send where the rank may already be gone (its death is the supervisor's to report)."""
    try:
        sender.send(command, fds)
    except OSError:
        pass
