"""Kernel side of a warm session: its local ranks, and how a task runs on any ``base.WarmRanks``.

``SessionProcesses`` starts the ranks once with the process backend's machinery (fork, forkserver, spawn; the
same pipes, lifeline and set-up) plus a command socket each; ``SessionXlaHost`` keeps a TPU host's device threads.

Whatever keeps the ranks (those two, or ``ray.session.SessionRayActors``), ``Session`` drives them only through the
contract and what is here: ``SessionRunBackend`` is the ``Backend`` a ``Launch`` runs for each ``Session.run`` or
``%%ranks`` cell: it sends the task and supervises the ranks until every one is idle again — the same events,
root-cause rule, Stop, timeout and stack dumps as a launch — with ``SessionSupervisor``: the launch's
``Supervisor`` with two of its extension points set, ``InterruptRanks`` (it interrupts busy ranks instead of ending
them, and cuts a process group left half way through a collective) and ``EndCondition.ALL_IDLE``. ``quiet_task``
runs the session's own tasks (joining the group, a new group) without a dashboard, ``close_gracefully`` ends the
ranks as programs end; each task's end is a ``TaskEnd``, which says what the session must mend.
"""
from __future__ import annotations

import os
import selectors
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from ..outcome.root_cause import Outcome, is_interrupt
from ..plan.plan import LaunchPlan
from ..rank.session import SessionRankSpec, session_rank_main
from ..wire.commands import (BreakGroup, Command, CommandSender, Interrupt, RunFunction, Shutdown,
                             session_socketpair)
from ..wire.events import RankEvent, RankFailed, RankStarted
from ..wire.fds import PassedFd
from ..wire.payload import PickledPayload
from .base import Backend, LaunchSink, StopPolicy, WarmRanks
from .processes.backend import ProcessBackend
from .prompts import Asker
from .rendezvous import HostedStore
from .supervisor import EndCondition, RankPhase, RankProcess, RankWatch, StopStrategy, Supervisor
from .xla.backend import XlaBackend

BREAK_GROUP_AFTER = 0.3   # s an interrupted rank may take to leave Python code before its collectives are cut


class SessionRanks:
    """``base.WarmRanks`` for ranks this machine starts (mixed into ``ProcessBackend`` and ``XlaBackend``): a
    command socket each (the rank's end handed over as it starts, the kernel's kept), the pid each rank runs in,
    and ``kill``."""

    ranks_are_threads = False  # TPU ranks are device threads: interrupted by a command, not by SIGINT
    answers_own_socket = False  # what is typed at a rank's prompt goes on its command socket
    plan: LaunchPlan

    @classmethod
    def open_store(cls, plan: LaunchPlan) -> HostedStore:
        """The store the ranks meet at for the session's life: hosted by the kernel."""
        site = plan.site  # LocalProcesses or XlaHost: the kernel hosts the store
        return HostedStore(site.master_addr, site.use_port, plan.world_size)  # type: ignore[attr-defined]

    @classmethod
    def function_task(cls, function: Callable[..., Any], args: tuple, kwargs: Dict[str, Any],
                      return_all: bool) -> Tuple[RunFunction, List[int], Callable[[], None]]:
        """``Session.run``'s command for ``function``, the fds it carries (large data in shared memory) and what
        releases them once the task is over."""
        payload = PickledPayload.create(function, args, kwargs, into_rank_namespace=True)
        command = RunFunction(task_id=0, data=payload.data, storages=payload.storages, buffers=payload.buffers,
                              shared_sizes=payload.shared_sizes, return_all=return_all)
        return command, list(payload.shared_fds), payload.close

    def started_event(self, rank: int) -> RankStarted:
        """The ``RankStarted`` a run's dashboard gets for ``rank`` (it said it once, when the session started)."""
        return RankStarted(rank=rank, pid=self.pids[rank])

    def _open_sessions(self, group_backend: Optional[str], group_generation: int) -> None:
        self.group_backend = group_backend
        self.group_generation = group_generation
        self.sockets = {rank: session_socketpair() for rank in range(self.plan.world_size)}
        self.commands: Dict[int, CommandSender] = {}
        self.handles: List[RankProcess] = []
        self.pids: Dict[int, int] = {}     # where each rank runs, as its RankStarted said

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        try:
            handles = super().start(rendezvous_env)  # type: ignore[misc]
        finally:
            for _, rank_end in self.sockets.values():  # only the ranks hold their ends now
                rank_end.close()
        self.commands = {rank: CommandSender(kernel) for rank, (kernel, _) in self.sockets.items()}
        for handle in handles:
            handle.answers = self.commands[handle.rank]
        self.handles = handles
        self.pids = {handle.rank: handle.pid for handle in handles}
        return handles

    def kill(self) -> None:
        """End every rank now (SIGKILL to each rank's process group), reap it, close the kernel's ends."""
        for handle in self.handles:
            handle.signal_group(signal.SIGKILL)
        for handle in self.handles:
            handle.process.join(5.0)
            handle.close_fds()  # those a supervisor did not close at EOF
        self.handles = []
        self.close()

    def close(self) -> None:
        for sender in self.commands.values():
            sender.close()
        for kernel, _ in self.sockets.values():
            kernel.close()
        super().close()  # type: ignore[misc]


class SessionProcesses(SessionRanks, ProcessBackend, WarmRanks):
    """The session's rank processes: a launch's, plus each rank's end of a command socket."""

    name = "session"
    spec_class = SessionRankSpec
    rank_target = staticmethod(session_rank_main)
    runs_the_plans_call = False

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


class SessionXlaHost(SessionRanks, XlaBackend, WarmRanks):
    """A TPU session: the launch's XLA host, whose device threads serve tasks from their command sockets
    instead of running one function — workers, device threads and their compiled graphs stay up."""

    name = "session-xla"
    ranks_are_threads = True

    def __init__(self, plan: LaunchPlan, group_backend: Optional[str], group_generation: int) -> None:
        XlaBackend.__init__(self, plan)
        self._open_sessions(None, group_generation)  # XLA's collectives need no torch.distributed group

    def _host_spec_extras(self) -> Dict[str, object]:
        return {"command_fds": [PassedFd(rank_end.fileno()) for _, rank_end in self.sockets.values()]}


class InterruptRanks(StopStrategy):
    """How a run on warm ranks is stopped without ending them.

    Each busy rank is interrupted (SIGINT: ``KeyboardInterrupt`` in its task, and the rank stays; a TPU device
    thread gets an ``Interrupt`` command, which its reader thread raises in it). ``BREAK_GROUP_AFTER`` seconds
    later every live rank cuts its process group's connections, so one blocked in a collective its peer left
    gets an error. A rank still busy ``recover_timeout`` seconds after that is beyond reach: every rank is killed
    and ``gave_up`` says why (the session then starts afresh). The ``KeyboardInterrupt`` an interrupted rank
    raises is the echo of the stop, not a failure of its own.
    """

    def __init__(self, commands: Mapping[int, CommandSender], *, task_id: int, recover_timeout: float,
                 ranks_are_threads: bool) -> None:
        self.commands = commands
        self.task_id = task_id
        self.recover_timeout = recover_timeout
        self.ranks_are_threads = ranks_are_threads
        self.broke_group = False
        self.gave_up: Optional[str] = None

    def begin(self, supervisor: Supervisor, watches: List[RankWatch]) -> None:
        for watch in watches:
            if self.ranks_are_threads:  # a device thread: its reader thread raises in it
                send_quietly(self.commands[watch.rank], Interrupt(task_id=self.task_id))
                continue
            try:
                os.kill(watch.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def escalate(self, supervisor: Supervisor, waited: float) -> None:
        if waited >= BREAK_GROUP_AFTER and not self.broke_group:
            self.break_group(supervisor)
        if waited >= BREAK_GROUP_AFTER + self.recover_timeout and self.gave_up is None:
            stuck = ", ".join(str(watch.rank) for watch in supervisor.alive() if watch.phase is not RankPhase.IDLE)
            self.gave_up = (f"rank {stuck} did not stop within {self.recover_timeout:g} s "
                            f"(recover_timeout); it may be stuck in a C++ call or collective")
            supervisor.kill_alive()

    def is_echo(self, event: RankFailed) -> bool:
        return is_interrupt(event)

    def break_group(self, supervisor: Supervisor) -> None:
        """Tell every live rank to cut its process group's connections to the others (its reader thread does it
        at once, also while its main thread is blocked in a collective)."""
        self.broke_group = True
        pids = {watch.rank: watch.pid for watch in supervisor.alive()}
        for rank in pids:
            peers = [pid for other, pid in pids.items() if other != rank]
            send_quietly(self.commands[rank], BreakGroup(peer_pids=peers, kernel_pid=os.getpid()))

    # ``abandon`` does nothing more: after Ctrl-C the session mends or restarts its ranks (``SessionRunBackend``).


class SessionSupervisor(Supervisor):
    """Supervises one task on warm ranks until each is idle again (``TaskDone``) or gone: a ``Supervisor`` that
    stops with ``InterruptRanks`` and ends at ``EndCondition.ALL_IDLE``, and says how the task left the ranks
    (``busy``, ``lost``, ``gave_up``, ``broke_group``, their collective counts) for the session to mend."""

    # A supervisor per task, over the same fds: poll(2) registers them without a system call each.
    selector_class = selectors.PollSelector

    def __init__(self, handles: List[RankProcess], deliver: Callable[[RankEvent], None], tick: Callable[[], None],
                 *, policy: StopPolicy, expect_results: Callable[[int], bool], task_id: int,
                 recover_timeout: float, ranks: WarmRanks, asker: Optional[Asker] = None) -> None:
        self.interrupts = InterruptRanks(ranks.commands, task_id=task_id, recover_timeout=recover_timeout,
                                         ranks_are_threads=ranks.ranks_are_threads)
        # The ranks said RankStarted when the session started: their stack dumps are armed, and a TPU rank runs
        # in a worker, not in the host we started.
        super().__init__(handles, deliver, tick, policy=policy, expect_results=expect_results,
                         stopping=self.interrupts, ends_when=EndCondition.ALL_IDLE, task_id=task_id,
                         warm_pids=ranks.pids, asker=asker)

    @property
    def gave_up(self) -> Optional[str]:
        """Why every rank was killed (one stayed busy past ``recover_timeout``), or None."""
        return self.interrupts.gave_up

    @property
    def broke_group(self) -> bool:
        """Whether the ranks were told to cut their process group."""
        return self.interrupts.broke_group

    @property
    def sequences(self) -> Dict[int, Optional[int]]:
        """Each idle rank's count of collectives on its process group (unequal: the task left it half way)."""
        return {rank: done.group_sequence for rank, done in self.tasks_done.items()}

    @property
    def shadowed(self) -> Set[str]:
        """Kernel names the ranks have their own of (``TaskDone.shadowed``)."""
        return {name for done in self.tasks_done.values() for name in done.shadowed}

    def settled(self) -> bool:
        """Every rank is idle again or gone: the task is over."""
        return self.ended()

    def busy(self) -> List[int]:
        return sorted(watch.rank for watch in self.alive() if watch.phase is not RankPhase.IDLE)

    def lost(self) -> List[int]:
        return sorted(rank for rank, watch in self.watches.items() if not watch.phase.alive)


@dataclass(frozen=True)
class TaskEnd:
    """How a task left the warm ranks — what ``Session`` reads to mend them, instead of the supervisor itself.

    ``lost``: ranks gone; ``gave_up``: why every rank was killed (one stayed busy past ``recover_timeout``);
    ``settled``: every rank idle again or gone; ``failed``: a rank failed; ``ended_early``: the task was ended
    before its ranks were done (a failure, Stop, the timeout); ``group_out_of_step``: the ranks were told to cut
    their process group, or their counts of collectives differ (the task left it half way); ``shadowed``: kernel
    names the ranks have their own of; ``pids``: where each rank runs, as it said.
    """

    lost: List[int]
    gave_up: Optional[str]
    settled: bool
    failed: bool
    ended_early: bool
    group_out_of_step: bool
    shadowed: Set[str] = field(default_factory=set)
    pids: Dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, supervisor: SessionSupervisor) -> "TaskEnd":
        return cls(lost=supervisor.lost(), gave_up=supervisor.gave_up, settled=supervisor.settled(),
                   failed=bool(supervisor.failures),
                   ended_early=supervisor.status is not None or bool(supervisor.failures),
                   group_out_of_step=supervisor.broke_group or len(set(supervisor.sequences.values())) > 1,
                   shadowed=supervisor.shadowed, pids=supervisor.pids)

    def ranks_lost(self) -> Optional[str]:
        """Why the ranks must start afresh (state lost): one stayed busy, died, or is not idle; None: they are fine."""
        if self.gave_up or self.lost or not self.settled:
            return self.gave_up or f"rank {', '.join(map(str, self.lost))} died"
        return None

    @property
    def group_left_broken(self) -> bool:
        """The task ended early and left the process group half way through a collective: it must be replaced."""
        return self.ended_early and self.group_out_of_step


def quiet_task(ranks: WarmRanks, command: Optional[Command], *, timeout: float, recover_timeout: float,
               deliver: Callable[[RankEvent], None]) -> Tuple[TaskEnd, Outcome]:
    """A task of the session's own (``command``; None: wait for the task the ranks start with, joining the group),
    without a dashboard: its events go to ``deliver``. How it left the ranks, and how it ended."""
    task_id = command.task_id if command is not None else 0  # type: ignore[attr-defined]
    supervisor = SessionSupervisor(
        ranks.handles, deliver, lambda: None, policy=StopPolicy.starting_now(timeout, threading.Event()),
        expect_results=lambda rank: False, task_id=task_id, recover_timeout=recover_timeout, ranks=ranks)
    if command is not None:
        ranks.send_to_every_rank(command)
    outcome = supervisor.run()
    return TaskEnd.of(supervisor), outcome


def close_gracefully(ranks: WarmRanks, grace: float, deliver: Callable[[RankEvent], None]) -> None:
    """End the ranks as programs end (threads joined, ``atexit`` handlers run): ``Shutdown`` to each, then a launch's
    supervisor reads their last output and ends whatever outlives ``grace`` seconds."""
    if not ranks.handles:
        return
    ranks.send_to_every_rank(Shutdown())
    policy = StopPolicy.starting_now(grace, threading.Event())
    Supervisor(ranks.handles, deliver, lambda: None, policy=policy, expect_results=lambda rank: False).run()


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
    then let the session mend what the task left broken (``after``, given the ``TaskEnd``, also kept as ``ended``)."""

    name = "session"
    job = "run"

    def __init__(self, plan: LaunchPlan, *, ranks: WarmRanks, task_id: int, command: Command, fds: List[int],
                 recover_timeout: float, after: Callable[[TaskEnd, Callable[[RankEvent], None]], None]) -> None:
        super().__init__(plan)
        self.ranks = ranks
        self.task_id = task_id
        self.command = command
        self.fds = fds
        self.recover_timeout = recover_timeout
        self.after = after
        self.supervisor: Optional[SessionSupervisor] = None
        self.ended: Optional[TaskEnd] = None
        self._deliver: Callable[[RankEvent], None] = lambda event: None

    def open_rendezvous(self) -> "_SessionStore":  # type: ignore[override]
        return _SessionStore({})

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        self._deliver = sink.deliver
        if hasattr(self.command, "no_one_types"):  # the task's prompts: answered here, or skipped (and why)
            self.command.no_one_types = sink.asker.absent  # type: ignore[attr-defined]
        for handle in self.ranks.handles:  # the rows of this run's dashboard: each rank is there, and running
            sink.deliver(self.ranks.started_event(handle.rank))
        self.ranks.send_to_every_rank(self.command, self.fds)  # a rank already gone is the supervisor's to report

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        self.supervisor = SessionSupervisor(
            self.ranks.handles, sink.deliver, sink.tick, policy=policy,
            expect_results=lambda rank: self.plan.sends_result(rank), task_id=self.task_id,
            recover_timeout=self.recover_timeout, ranks=self.ranks, asker=sink.asker)
        return self.supervisor.run()

    def _close(self) -> None:
        supervisor = self.supervisor
        if supervisor is not None:
            self.ended = TaskEnd.of(supervisor)
            self.supervisor = None  # it holds the launch's deliver: no cycle keeps the result alive
            self.after(self.ended, self._deliver)
        self._deliver = lambda event: None  # the launch's: no cycle keeps an ended launch (and its result) alive

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self.supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}


def send_quietly(sender: CommandSender, command: Command, fds: Optional[List[int]] = None) -> None:
    """Send where the rank may already be gone (its death is the supervisor's to report)."""
    try:
        sender.send(command, fds)
    except OSError:
        pass
