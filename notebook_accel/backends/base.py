"""The contracts every way of starting ranks implements: ``Backend`` (a launch), ``WarmRanks`` (a session's ranks),
and the one restart loop (``run_attempts``).

A backend gets a validated ``LaunchPlan``, the rendezvous environment the kernel hosts, and a ``LaunchSink``
(where events go, a clock tick for the view, whether Stop was pressed). It owns its whole sequence — start
the ranks, supervise them, clean up — and returns how the launch ended as an ``Outcome``. It never raises
for a rank's failure (that is an ``Outcome``), only ``KeyboardInterrupt`` after it stopped every rank, or a
``LaunchConfigError`` found before any rank started.

Shaped after Lightning's ``fabric/strategies/launchers`` (one small base, one class per mechanism).
"""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Mapping, Optional, Tuple, TypeVar

from ..errors import one_line
from ..outcome.root_cause import Outcome, is_time_limit
from ..wire.commands import Command, RunFunction
from ..wire.events import AttemptStarted, RankEvent, RankStarted, Status
from .prompts import Asker

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.plan import LaunchPlan
    from .rendezvous import HostedStore


@dataclass
class LaunchSink:
    """Where a backend sends what happens: ``deliver`` every event in order, ``tick`` about every 0.1 s
    (the view's clock), and ``stop_requested`` set when the user pressed Stop or called ``Launch.stop()``.
    ``asker``: where a rank's prompt (pdb, ``input()``) is asked (``backends.prompts``); the default says no one
    can type."""

    deliver: Callable[[RankEvent], None]
    tick: Callable[[], None]
    stop_requested: threading.Event
    asker: Asker = field(default_factory=lambda: Asker(absent="this kind of launch does not ask (several nodes, "
                                                               "restarts)"))


@dataclass
class StopPolicy:
    """When a launch must end before its ranks do: the user asked (Stop, ``Launch.stop()``) or the timeout
    passed. One object, made by ``Backend.run`` for every backend, so "stopped" and "timeout" mean the same
    everywhere; a failure is the supervisor's business (the root-cause rule), not the policy's.

    >>> policy = StopPolicy(threading.Event(), deadline=None)
    >>> policy.reason() is None
    True
    >>> policy.stop_requested.set(); policy.reason()
    <Status.STOPPED: 'stopped'>
    """

    stop_requested: threading.Event
    deadline: Optional[float]  # time.monotonic() past which the launch times out; None: never
    # While a rank waits at a prompt (someone is debugging it), the clock of the timeout is held: the time spent
    # there is added to the deadline. ``held_since``: when it was held; ``held_total``: seconds held before.
    held_since: Optional[float] = None
    held_total: float = 0.0

    @classmethod
    def starting_now(cls, timeout: Optional[float], stop_requested: threading.Event) -> "StopPolicy":
        return cls(stop_requested, None if timeout is None else time.monotonic() + timeout)

    def reason(self, now: Optional[float] = None) -> Optional[Status]:
        """``STOPPED`` once asked to stop, ``TIMEOUT`` once past the deadline (a stop wins; never while held),
        else ``None``."""
        if self.stop_requested.is_set():
            return Status.STOPPED
        if self.held_since is None and self.deadline is not None and \
                (time.monotonic() if now is None else now) >= self.deadline:
            return Status.TIMEOUT
        return None

    def remaining(self) -> Optional[float]:
        """Seconds left before the timeout (at least a millisecond), or ``None`` without one."""
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())

    def hold(self, now: Optional[float] = None) -> None:
        """Stop the timeout's clock (a rank waits at a prompt: the person debugging it is not slow code)."""
        if self.held_since is None:
            self.held_since = time.monotonic() if now is None else now

    def release(self, now: Optional[float] = None) -> None:
        """Start the timeout's clock again, the held time added to the deadline."""
        if self.held_since is not None:
            held = (time.monotonic() if now is None else now) - self.held_since
            self.held_total += held
            if self.deadline is not None:
                self.deadline += held
            self.held_since = None

    def running_time(self, now: Optional[float] = None) -> float:
        """``time.monotonic()`` less every second the clock was held: how long the ranks ran between two times."""
        now = time.monotonic() if now is None else now
        return now - self.held_total - (now - self.held_since if self.held_since is not None else 0.0)


class Backend(ABC):
    """How ranks start. Subclasses set ``name`` (the value of ``LaunchPlan.backend``) and fill in the steps of
    ``run``, which owns the policy — as torch elastic's ``PContext.start/wait/close`` owns it and its
    subclasses implement ``_start/_poll/_close``:

    ``run``: ``policy = StopPolicy(timeout from the plan, Stop)`` → ``_start(env, sink)`` → ``_supervise(sink,
    policy)`` until every rank is gone → ``_close()``, always (also on Ctrl-C or an error). ``_supervise``
    returns the ``Outcome``: FINISHED, FAILED (the root cause), or STOPPED / TIMEOUT as ``policy.reason()``
    says; on ``KeyboardInterrupt`` it stops every rank first, then lets it propagate.

    Example::

        backend = backend_for(plan)
        store = backend.open_rendezvous()
        try:
            outcome = backend.run(store.env(), LaunchSink(view.handle, view.tick, threading.Event()))
        finally:
            store.close()
    """

    name: ClassVar[str]
    job: ClassVar[str] = "launch"  # what the user started, in messages: "the launch ran past timeout=..."
    # Whether the backend delivers the launch's ``LaunchStarted`` itself (several nodes: once the rendezvous placed
    # this node); else the ``Launch`` delivers it before the backend runs.
    announces_start: ClassVar[bool] = False

    def __init__(self, plan: "LaunchPlan") -> None:
        self.plan = plan

    def open_rendezvous(self) -> "HostedStore":
        """Host the store the ranks meet at, synchronously, so a busy port fails in the caller's cell.
        Backends whose ranks meet elsewhere (several nodes) override this."""
        from .rendezvous import HostedStore

        site = self.plan.site  # a site whose store the kernel hosts: it says where (``plan.sites``)
        return HostedStore(site.master_addr, site.use_port, self.plan.world_size)  # type: ignore[attr-defined]

    def run(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> Outcome:
        """Start every rank, supervise it to the end, leave nothing running; return how it ended."""
        policy = StopPolicy.starting_now(self.plan.timeout, sink.stop_requested)
        try:
            self._start(rendezvous_env, sink)
            return self._supervise(sink, policy)
        finally:
            self._close()

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        """Start the ranks (or join the world); nothing to do where the ranks start inside ``_supervise``."""

    @abstractmethod
    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        """Watch the ranks until every one is gone, ending them early when ``policy.reason()`` says so."""

    def _close(self) -> None:
        """Release what ``_start`` took; called once, whatever happened."""

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        """Every running rank's Python stacks (all threads), by rank; callable from any thread while
        ``run`` runs. A rank that does not answer within ``timeout`` seconds is left out."""
        return {}


# ---------------------------------------------------------------------------------------------- restarts

Result = TypeVar("Result")
Failed = TypeVar("Failed")


def run_attempts(max_restarts: int, deliver: Callable[[RankEvent], None], attempt: Callable[[int], Result],
                 restartable: Callable[[Result], Optional[Failed]],
                 describe: Callable[[Failed], str] = str) -> Tuple[Result, List[Failed]]:
    """The one restart loop of every backend that restarts the whole world after a failure (``max_restarts``):
    run ``attempt(0)``, then ``attempt(1)``, ... while the last one's failure is ``restartable`` (the failure, or
    None when it is not: a success, a stop, a timeout, a function that cannot load, a lost node) and restarts are
    left. With restarts allowed, each attempt is announced first (``AttemptStarted``, with the earlier failures as
    ``describe`` says them). Returns the last attempt's result and the earlier attempts' failures, in order.

    >>> results = iter([("failed", "rank 1 raised"), ("finished", None)])
    >>> run_attempts(2, lambda event: None, lambda number: next(results), lambda result: result[1])
    (('finished', None), ['rank 1 raised'])
    """
    history: List[Failed] = []
    number = 0
    while True:
        if max_restarts:
            deliver(AttemptStarted(rank=-1, attempt=number, max_restarts=max_restarts,
                                   previous_errors=[describe(failure) for failure in history]))
        result = attempt(number)
        failure = restartable(result) if number < max_restarts else None
        if failure is None:
            return result, history
        history.append(failure)
        number += 1


def restartable_failure(outcome: Outcome) -> Optional[str]:
    """A failed world's root cause in one line, when a new world may run: the ``restartable`` of ``run_attempts``
    for a backend whose attempts end as an ``Outcome`` (Ray, Slurm). Not when the function cannot load, nor when the
    ranks stopped at a time limit with a checkpoint (``TimeLimitReached``): that is not a crash, and a new world in
    the same job would start the work again blindly, with no more time; the launch raises it, and the next launch
    (or a detached job's requeue) resumes from that checkpoint."""
    root = outcome.root
    if outcome.status != Status.FAILED or root is None:
        return None
    if root.event is not None and (root.event.loading or is_time_limit(root.event)):
        return None
    return one_line(outcome.local_exception) if outcome.local_exception is not None else f"rank {root.rank} failed"


# ------------------------------------------------------------------------------------------- warm ranks

class WarmRanks(ABC):
    """The ranks of a ``Session``, kept up across runs: what a backend provides so that sessions work there.

    ``Session`` drives any of them the same way (``backends.session``: every task is a command sent to each rank
    and supervised until each is idle again; a process group cut and replaced; ranks made anew with "state lost"):

    ``store = cls.open_store(plan)`` once for the session's life → ``ranks = cls(plan, group_backend, generation)``
    → ``ranks.start(store.env())`` (the ranks start, serve commands, and join the process group as their first
    task) → tasks, each ``ranks.commands[rank].send(command, fds)`` → ``ranks.kill()``; a restart is a new object.

    Subclasses: ``backends.session.SessionProcesses`` (local processes), ``SessionXlaHost`` (a TPU host's device
    threads), ``backends.ray.session.SessionRayActors`` (a cluster's actors),
    ``backends.slurm.session.SessionSlurmStep`` (the tasks of a Slurm job step).
    """

    # Ranks that are threads (a TPU device thread, a Ray actor's) are interrupted by a command, not by SIGINT.
    ranks_are_threads: ClassVar[bool] = False
    plan: "LaunchPlan"
    handles: List[Any]                      # a ``RankProcess`` per rank (what a supervisor reads), once started
    commands: Mapping[int, Any]             # a ``CommandSender`` (or its twin) per rank: ``send(command, fds)``
    pids: Dict[int, int]                    # where each rank runs, by rank

    @abstractmethod
    def __init__(self, plan: "LaunchPlan", group_backend: Optional[str], group_generation: int) -> None:
        """Nothing starts yet. ``group_backend``: the process group the ranks join ("gloo", "nccl"; None: none)."""

    @classmethod
    @abstractmethod
    def open_store(cls, plan: "LaunchPlan") -> Any:
        """The store the ranks meet at for the session's life (``env()``, ``close()``: as ``Backend.open_rendezvous``
        gives it), opened in the caller's cell so that a busy port or an unreachable cluster fails there."""

    @classmethod
    @abstractmethod
    def function_task(cls, function: Callable[..., Any], args: tuple, kwargs: Dict[str, Any],
                      return_all: bool) -> Tuple[RunFunction, List[int], Callable[[], None]]:
        """``Session.run``'s command for ``function``, the fds it carries, and what releases them after the task."""

    @abstractmethod
    def start(self, rendezvous_env: Dict[str, str]) -> List[Any]:
        """Start every rank serving commands; their handles (``RankProcess``), by rank."""

    @abstractmethod
    def started_event(self, rank: int) -> RankStarted:
        """The ``RankStarted`` a run's dashboard gets for ``rank`` (it said it once, when the session started)."""

    @abstractmethod
    def kill(self) -> None:
        """End every rank now and release what ``start`` took (idempotent)."""

    def send(self, rank: int, command: Command, fds: Optional[List[int]] = None) -> None:
        """Send ``command`` to ``rank``, where it may already be gone (its death is the supervisor's to report)."""
        try:
            self.commands[rank].send(command, fds)
        except OSError:
            pass

    def send_to_every_rank(self, command: Command, fds: Optional[List[int]] = None) -> None:
        """Send ``command`` to every rank (``send``: each may already be gone). A transport that carries one message to
        every rank at once sends it once (``relay.RelayedWarmRanks``)."""
        for rank in list(self.commands):
            self.send(rank, command, fds)
