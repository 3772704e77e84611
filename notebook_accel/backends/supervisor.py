"""Kernel side of local ranks, for a launch and for each run on a session's warm ranks: read every rank's pipes
and sentinel, fail fast, stop, clean up.

One loop in one thread (the kernel's main thread for ``notebook_launcher``, so Ctrl-C / Jupyter's interrupt
arrive here as ``KeyboardInterrupt``). It turns bytes into events for the view, decides the root cause of
a failure, and guarantees that when it returns every rank is where its end condition says — for a launch, gone,
with everything it started.

What it reads of a rank is a ``RankProcess`` (the handle the process and XLA backends make); what it knows of
it is a ``RankWatch``, whose ``RankPhase`` says where the rank is. A launch and a run on warm ranks share the
loop through two declared extension points, given to the ``Supervisor``, never by overriding its steps:

- ``stopping``, a ``StopStrategy``: how ranks are stopped before they end on their own (Stop, timeout, a
  failure, Ctrl-C). ``TerminateRanks`` (a launch) is here; ``backends.session.InterruptRanks`` (a run on warm
  ranks: interrupt, cut the process group, kill past a bound) is the session's.
- ``ends_when``, an ``EndCondition``: ``ALL_GONE`` (a launch) or ``ALL_IDLE`` (a task on warm ranks).

A rank at a prompt (pdb, ``input()``) is asked about in this thread (``backends.prompts``): while ``input()`` waits,
the same loop runs on in a helper thread. The timeout and the early-leaver notice do not count the time a rank
waits at a prompt, and a rank in post-mortem is not stopped for its own failure until the person is done.
"""
from __future__ import annotations

import codecs
import enum
import multiprocessing.process
import os
import pickle
import queue
import select
import selectors
import signal
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set

from ..errors import LaunchError
from ..formatting import signal_name
from ..outcome.root_cause import Failure, Outcome, choose_root_cause, is_interrupt
from ..outcome.stacks import fold_inherited_frames, where_waiting
from ..wire.channel import EventDecoder, receive
from ..wire.events import (OutputLine, OutputLines, PeersWaiting, PromptKind, RankEvent, RankExited, RankFailed,
                           RankPrompt, RankResult, RankStacks, RankStarted, Status, TaskDone)
from ..wire.fds import pending_bytes
from .base import StopPolicy
from .draining import PipeDrain, held_open_note, still_writing_note
from .prompts import Asker, NoOneTypes, PromptDesk, PromptWithdrawn, ask_while

TICK_SECONDS = 0.1          # view.tick() cadence, and the longest the loop sleeps
ROOT_CAUSE_WINDOW = 0.25    # after a first failure, how long to collect others before naming the root cause
TERMINATE_GRACE = 1.0       # SIGTERM, then SIGKILL after this
KILLED_WAIT = 1.0           # after Ctrl-C, how long ranks that got SIGKILL may take to be gone
STACKS_WAIT = 2.0           # how long a timeout waits for the ranks' stack dumps
STACKS_QUIET = 0.15         # a dump is complete once its pipe has been quiet this long
# After reading a rank's output, let more of it gather this long before reading output again (events, stacks
# and exits are still read at once). A chatty rank's lines then come in a few large reads instead of one read
# and one wake-up of this loop per write: the kernel's per-line work stops competing with the ranks for the
# cores. A line written after a quiet spell is read at once.
OUTPUT_REST = 0.005
PEER_WAIT_VARIABLE = "NOTEBOOK_ACCEL_PEER_WAIT"  # seconds a rank may have finished while others run, unsaid
DEFAULT_PEER_WAIT = 30.0
START_WAIT_VARIABLE = "NOTEBOOK_ACCEL_START_WAIT"  # seconds a rank may take to start (run our first line), unsaid
DEFAULT_START_WAIT = 60.0
_READ_BYTES = 1 << 16
_OUTPUT = ("stdout", "stderr")


@dataclass
class RankProcess:
    """A started rank: its process and the kernel's read ends of its stdout, stderr, event and stacks pipes.

    The handle owns those read ends: whoever reads them (a launch's supervisor, each run's on a warm rank)
    closes one through ``close_fd``, and ``close_fds`` closes the rest, each exactly once.
    """

    rank: int
    process: multiprocessing.process.BaseProcess
    stdout_fd: int
    stderr_fd: int
    events_fd: int
    stacks_fd: int   # faulthandler writes the rank's Python stacks here on SIGUSR1 (``Launch.dump_stacks``)
    # Where the lines typed at the rank's prompts go (pdb, input(): ``backends.prompts``); None: nowhere. A
    # ``CommandSender``, or anything whose ``send(answer)`` gets the answer to the rank (a Ray rank's relay).
    answers: Optional[Any] = None
    closed: Set[int] = field(default_factory=set, repr=False)

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

    def ask_stacks(self, pid: int) -> bool:
        """Ask the rank running in ``pid`` for its Python stacks (SIGUSR1: faulthandler writes them onto its stacks
        pipe); False when it is gone. Ranks elsewhere (a Ray actor's) answer through their own channel."""
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return True

    def close_fd(self, fd: int) -> None:
        """Close the read end ``fd`` of one of this rank's pipes (once: the number may be reused afterwards)."""
        if fd not in self.closed:
            self.closed.add(fd)
            os.close(fd)

    def close_fds(self) -> None:
        """Close every read end not closed yet."""
        for fd in self.fds:
            self.close_fd(fd)


class RankPhase(enum.Enum):
    """Where a rank is, for the supervisor watching it. The transitions (``RankWatch`` makes them):

    ``STARTING`` --RankStarted--> ``RUNNING`` --TaskDone--> ``IDLE`` (a task on warm ranks);
    ``STARTING``, ``RUNNING``, ``IDLE`` --its process (or XLA device thread) is gone--> ``STOPPED`` when the
    supervisor had stopped it (one of its ``still_running``), else ``EXITED``. Both are final. A warm rank,
    which said RankStarted to an earlier supervisor, begins ``RUNNING``.
    """

    STARTING = "starting"  # started, has not said RankStarted: no stack dump to ask of it (SIGUSR1 would kill it)
    RUNNING = "running"    # runs the function, or the task
    IDLE = "idle"          # a warm rank done with this task (TaskDone): waits for the next one
    EXITED = "exited"      # gone on its own (or ended by an XLA worker's pool)
    STOPPED = "stopped"    # gone after the supervisor stopped it

    @property
    def alive(self) -> bool:
        return self not in (RankPhase.EXITED, RankPhase.STOPPED)


class RankWatch:
    """What the supervisor knows of one rank: its phase, where it runs, its open pipes and what they carried."""

    def __init__(self, handle: RankProcess, phase: RankPhase = RankPhase.STARTING, pid: Optional[int] = None) -> None:
        self.handle = handle
        self.rank = handle.rank
        self.phase = phase
        self.pid = handle.pid if pid is None else pid  # where the rank runs, as its RankStarted says
        self.open_fds = {handle.stdout_fd: "stdout", handle.stderr_fd: "stderr", handle.events_fd: "events",
                         handle.stacks_fd: "stacks"}
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        self.partial = {"stdout": "", "stderr": ""}
        self.events = EventDecoder()
        # Once its process is gone: each pipe read to EOF, or given up when only what the rank left behind
        # holds it open (``backends.draining``).
        self.drains: Dict[int, PipeDrain] = {}
        self.exited_at = 0.0            # when it was found gone (a failure's time, how long peers waited)
        self.exited_running = 0.0       # the policy's running time then (the time ranks sat at prompts left out)
        self.exitcode: Optional[int] = None
        self.failed: Optional[RankFailed] = None
        self.result: Optional[RankResult] = None
        self.stacks = bytearray()       # everything faulthandler wrote for this rank's dumps
        self.stacks_at = 0.0            # when the last of it arrived

    @property
    def done(self) -> bool:
        """Gone, and every pipe read to EOF (or given up)."""
        return not self.phase.alive and not self.open_fds

    @property
    def answers_stacks(self) -> bool:
        """Alive and said RankStarted: its SIGUSR1 stack dump is armed."""
        return self.phase in (RankPhase.RUNNING, RankPhase.IDLE)

    def said_started(self, pid: int) -> None:
        self.pid = pid  # an XLA device thread runs in a worker, not in the process we started
        if self.phase is RankPhase.STARTING:
            self.phase = RankPhase.RUNNING

    def task_done(self) -> None:
        if self.phase is RankPhase.RUNNING:
            self.phase = RankPhase.IDLE

    def gone(self, exitcode: Optional[int], now: float, *, stopped: bool) -> None:
        self.exitcode = exitcode
        self.exited_at = now
        self.phase = RankPhase.STOPPED if stopped else RankPhase.EXITED

    def start_draining(self, now: float) -> None:
        """Its process is gone: what is left in its pipes is all it wrote."""
        if not self.drains:
            self.drains = {fd: PipeDrain(fd, now) for fd in self.open_fds}


class EndCondition(enum.Enum):
    """When ``Supervisor.run`` returns."""

    ALL_GONE = "all gone"  # a launch: every rank's process gone and its pipes read (to EOF, or given up)
    ALL_IDLE = "all idle"  # a task on warm ranks: every rank idle again (its TaskDone) or gone; pipes stay open

    def reached(self, watches: Iterable[RankWatch]) -> bool:
        if self is EndCondition.ALL_GONE:
            return all(watch.done for watch in watches)
        return all(watch.phase is RankPhase.IDLE or not watch.phase.alive for watch in watches)


class StopStrategy(ABC):
    """How a supervisor stops ranks before they end on their own (Stop, a timeout, a failure, Ctrl-C).

    The supervisor decides when, and which ranks (those running then: its ``still_running``); the strategy does
    it: ``begin`` once, ``escalate`` on every turn of the loop after that until the run ends, ``abandon`` when
    Ctrl-C ends the wait. ``Supervisor.kill_alive`` is the last resort of every strategy.
    """

    @abstractmethod
    def begin(self, supervisor: "Supervisor", watches: List[RankWatch]) -> None:
        """Start stopping the ranks of ``watches``."""

    @abstractmethod
    def escalate(self, supervisor: "Supervisor", waited: float) -> None:
        """``waited`` seconds after ``begin``, ranks still keep the run from ending: take the next step when due."""

    def is_echo(self, event: RankFailed) -> bool:
        """Whether a stopped rank's failure is only how it felt the stop (then not shown, nor a failure)."""
        return False

    def abandon(self, supervisor: "Supervisor") -> None:
        """After Ctrl-C (or an error in the loop), once the wait for the ranks is over: leave nothing behind
        that must not outlive the run."""


class TerminateRanks(StopStrategy):
    """A launch's stop: SIGTERM to each rank's process group, SIGKILL to what is left ``TERMINATE_GRACE``
    seconds later; after Ctrl-C, every rank is killed and reaped and every pipe closed."""

    def begin(self, supervisor: "Supervisor", watches: List[RankWatch]) -> None:
        for watch in watches:
            watch.handle.signal_group(signal.SIGTERM)

    def escalate(self, supervisor: "Supervisor", waited: float) -> None:
        if waited >= TERMINATE_GRACE and supervisor.killed_at is None:
            supervisor.kill_alive()

    def abandon(self, supervisor: "Supervisor") -> None:
        supervisor.kill_alive()
        for watch in supervisor.watches.values():
            watch.handle.process.join(1.0)
        supervisor.close_pipes()


@dataclass
class _StackRequest:
    timeout: float
    done: threading.Event = field(default_factory=threading.Event)
    stacks: Dict[int, str] = field(default_factory=dict)


class Supervisor:
    """Runs the loop over ``handles`` until ``ends_when`` holds; ``deliver`` receives every event in order,
    ``tick`` is called about every ``TICK_SECONDS``; ``policy`` says when to stop early, ``stopping`` how;
    ``expect_results(rank)`` whether that rank must send a result (a rank that ends without one failed).

    A run on warm ranks gives ``task_id`` (the task whose ``TaskDone`` makes a rank idle) and ``warm_pids`` (where
    each rank runs, as it said when the session started: the ranks begin ``RUNNING``).

    Example::

        supervisor = Supervisor(handles, view.handle, view.tick, policy=policy,
                                expect_results=plan.sends_result)
        outcome = supervisor.run()   # every rank gone; how the launch ended
    """

    # A supervisor per task over the same fds (a session's) takes poll(2): it registers them without a system
    # call each (epoll's registration is most of a warm run's cost in the kernel).
    selector_class: type = selectors.DefaultSelector

    def __init__(self, handles: Sequence[RankProcess], deliver: Callable[[RankEvent], None],
                 tick: Callable[[], None], *, policy: StopPolicy, expect_results: Callable[[int], bool],
                 stopping: Optional[StopStrategy] = None, ends_when: EndCondition = EndCondition.ALL_GONE,
                 task_id: Optional[int] = None, warm_pids: Optional[Mapping[int, int]] = None,
                 asker: Optional[Asker] = None) -> None:
        if warm_pids is None:
            self.watches = {handle.rank: RankWatch(handle) for handle in handles}
        else:
            self.watches = {handle.rank: RankWatch(handle, RankPhase.RUNNING, warm_pids.get(handle.rank))
                            for handle in handles}
        self.deliver = deliver
        self.tick = tick
        self.policy = policy
        self.expect_result = expect_results
        self.stopping = stopping if stopping is not None else TerminateRanks()
        self.ends_when = ends_when
        self.task_id = task_id
        self.tasks_done: Dict[int, TaskDone] = {}  # by rank: what it said when this task ended there
        self.peer_wait = _seconds_from_env(PEER_WAIT_VARIABLE, DEFAULT_PEER_WAIT)
        self._peers_noticed = False
        self.start_wait = _seconds_from_env(START_WAIT_VARIABLE, DEFAULT_START_WAIT)
        self._created_at = time.monotonic()
        self._start_noticed = False
        self.selector = self.selector_class()
        self.urgent = self.selector_class()   # all but the output pipes: what ``OUTPUT_REST`` never delays
        self._output_rests_until = 0.0
        # Several ranks may live in one process (an XLA host's device threads and workers): one sentinel each.
        carried: Dict[int, List[RankWatch]] = {}
        for watch in self.watches.values():
            for fd, name in watch.open_fds.items():
                # Reads never wait: a pipe a poll said was ready may have been read since (a prompt reads its
                # rank's output at once, a death its events), and a read that waits would hang the loop while
                # the rank waits for the loop (its prompt's answer).
                os.set_blocking(fd, False)
                self.selector.register(fd, selectors.EVENT_READ, (watch, "pipe"))
                if name not in _OUTPUT:
                    self.urgent.register(fd, selectors.EVENT_READ, (watch, "pipe"))
            carried.setdefault(watch.handle.process.sentinel, []).append(watch)
        for sentinel, watches in carried.items():
            self.selector.register(sentinel, selectors.EVENT_READ, (watches, "exit"))
            self.urgent.register(sentinel, selectors.EVENT_READ, (watches, "exit"))
        self.failures: List[Failure] = []
        self.status: Optional[Status] = None    # set once we decided to stop: FAILED | STOPPED | TIMEOUT
        self.still_running: List[int] = []      # the ranks it stopped (running when it decided to)
        self.stop_asked_at: Optional[float] = None  # when it began stopping them
        self.killed_at: Optional[float] = None  # when it last sent SIGKILL to every rank alive
        self._stack_requests: "queue.Queue[_StackRequest]" = queue.Queue()
        self._timeout_stacks: Dict[int, str] = {}
        self.desk = PromptDesk(asker, deliver)  # ranks waiting at a prompt (pdb, input()); ``asker`` asks for lines
        # Ranks in pdb on their own failure, not yet reported: their failure, counted from when the pdb began.
        self._post_mortems: Dict[int, Failure] = {}

    # ------------------------------------------------------------------------------------------ main loop

    def run(self) -> Outcome:
        """Block until ``ends_when`` holds. On KeyboardInterrupt: stop the ranks, then re-raise it."""
        try:
            while not self.ended():
                self._step()
                self._serve_prompts()
            self._drain()
        except BaseException:  # Ctrl-C, or a bug: either way the ranks must be stopped
            self._emergency_stop()
            raise
        finally:
            self.selector.close()
            self.urgent.close()
        return self._outcome()

    def _step(self) -> None:
        """One turn of the loop: read what is there, answer stack requests, decide, tick the view."""
        self._poll(TICK_SECONDS)
        self._serve_stack_requests()
        self._hold_while_prompted()
        self._decide(self.policy)
        self.tick()

    def ended(self) -> bool:
        """Whether the run is over, as ``ends_when`` says."""
        return self.ends_when.reached(self.watches.values())

    def alive(self) -> List[RankWatch]:
        """The ranks whose process (or thread) is still there, by rank."""
        return [watch for watch in self.watches.values() if watch.phase.alive]

    @property
    def pids(self) -> Dict[int, int]:
        """Where each rank runs, by rank (as its RankStarted said)."""
        return {rank: watch.pid for rank, watch in self.watches.items()}

    def _poll(self, wait: float) -> None:
        resting = self._output_rests_until - time.monotonic()
        selector = self.urgent if resting > 0 else self.selector
        read_output = False
        for key, _ in selector.select(min(wait, resting) if resting > 0 else wait):
            owner, kind = key.data  # a pipe's rank, or for a sentinel the ranks its process carried
            if kind == "pipe":
                if key.fd in owner.open_fds:  # not already drained to EOF earlier in this batch
                    read_output = read_output or owner.open_fds[key.fd] in _OUTPUT
                    self._read(owner, key.fd)
            else:
                self._on_exit(owner)
        if read_output:
            self._output_rests_until = time.monotonic() + OUTPUT_REST

    def _decide(self, policy: Optional[StopPolicy]) -> None:
        """Stop (asked), fail (the root cause is known), time out — in that order; then escalate and drain.
        ``policy`` is None once the ranks are being stopped anyway (Ctrl-C)."""
        now = time.monotonic()
        if self.status is None:
            reason = policy.reason(now) if policy is not None else None
            if reason == Status.STOPPED:
                self._stop(Status.STOPPED)
            elif self._post_mortems:
                pass  # a failed rank is in pdb: it says when it is done (then the failure rule applies)
            elif self.failures and now - self.failures[0].time >= ROOT_CAUSE_WINDOW:
                self._stop(Status.FAILED)
            elif self.failures and not self.alive():
                self.status = Status.FAILED
            elif not self.failures and not self._peers_noticed:
                self._notice_peers_waiting(now)  # says it, never ends the launch
            if self.status is None and not self._start_noticed:
                self._notice_not_started(now)    # nor does this
            if self.status is None and reason == Status.TIMEOUT:
                self._timeout_stacks = self._collect_stacks(STACKS_WAIT)  # where each rank was stuck
                self._stop(Status.TIMEOUT)
        if self.stop_asked_at is not None and not self.ended():
            self.stopping.escalate(self, now - self.stop_asked_at)
        for watch in self.watches.values():  # what a dead rank left running may keep its pipes open
            for fd, drain in list(watch.drains.items()):
                why = drain.give_up(self._fd_ready(fd), now) if fd in watch.open_fds else None
                if why is not None:
                    self._give_up_pipe(watch, fd, why)

    def _drain(self) -> None:
        """The loop ended with pipes still open (warm ranks live on; they flushed what they wrote before saying
        they were done): read what is in them now — all of it, however slow the view, but a pipe still written
        to once that is read (by a process the rank left outside its group) only as ``backends.draining`` says."""
        now = time.monotonic()
        draining = {(watch.rank, fd): PipeDrain(fd, now) for watch in self.watches.values() for fd in watch.open_fds}
        while draining:
            for (rank, fd), drain in list(draining.items()):
                watch = self.watches[rank]
                if fd not in watch.open_fds or not self._fd_ready(fd):  # read to EOF, or all that was there
                    del draining[(rank, fd)]
                    continue
                drain.got(self._read(watch, fd), time.monotonic())
                why = drain.give_up(True, time.monotonic())
                if why is not None:
                    del draining[(rank, fd)]
                    self._give_up_pipe(watch, fd, why)

    # ------------------------------------------------------------------------------------------- reading

    def _read(self, watch: RankWatch, fd: int) -> int:
        """Read what is in ``fd`` (one read, which never waits), pass it on; return how many bytes (0: nothing
        there now, or EOF, and then the pipe is closed)."""
        name = watch.open_fds[fd]
        fds: List[int] = []
        try:
            if name == "events":  # a socket: a result's shared-memory files come with its bytes
                chunk, fds = receive(fd, _READ_BYTES)
            else:
                chunk = os.read(fd, _READ_BYTES)
        except BlockingIOError:  # read since a poll said it was ready (``_read_output_now``, ``_rank_gone``)
            return 0
        except OSError:
            chunk = b""
        if fd in watch.drains:
            watch.drains[fd].got(len(chunk), time.monotonic())
        if name == "events":
            for event in watch.events.feed(chunk, fds):
                self._on_event(watch, event)
        elif name == "stacks":
            watch.stacks += chunk
            watch.stacks_at = time.monotonic()
        else:
            self._on_output(watch, name, chunk)
        if not chunk:
            self._close_fd(watch, fd)
        return len(chunk)

    def _read_output_now(self, watch: RankWatch) -> None:
        """Read what ``watch``'s rank wrote to fds 1/2 so far, resting or not: a prompt follows the lines the rank
        flushed before asking (pdb's "> file(line)"), and the view must show them before it says "at breakpoint".
        Only the bytes there now: a thread of the rank (or its subprocess) that keeps printing while it waits at
        the prompt cannot keep this loop from asking."""
        for fd, name in list(watch.open_fds.items()):
            if name not in _OUTPUT:
                continue
            owed = pending_bytes(fd)
            while owed > 0 and fd in watch.open_fds:
                got = self._read(watch, fd)
                if got <= 0:
                    break
                owed -= got

    def _on_output(self, watch: RankWatch, stream: str, chunk: bytes) -> None:
        text = watch.partial[stream] + watch.decoders[stream].decode(chunk, final=not chunk)
        lines = text.split("\n")
        watch.partial[stream] = lines.pop() if chunk else ""
        if not chunk and lines and lines[-1] == "":  # EOF right after a newline: no extra empty line
            lines.pop()
        if not lines:
            return
        if "\r" in text:  # a progress bar's carriage returns (rare): strip the line ends they leave
            lines = [line.rstrip("\r") for line in lines]
        self.deliver(OutputLines(rank=watch.rank, stream=stream, lines=lines))

    def _on_event(self, watch: RankWatch, event: RankEvent) -> None:
        if isinstance(event, RankExited):
            # The rank ended while the process we started lives on: an XLA device thread returned, or the
            # XLA host reports that a worker it forked (not our child) died. Its pipes stay open until
            # that process is gone: other ranks in it still write there.
            if watch.phase.alive:
                self._rank_gone(watch, event.exitcode, stopped_elsewhere=event.stopped, process_gone=False)
            return
        if isinstance(event, TaskDone):  # a warm rank finished a task (one it was interrupted in, too)
            if event.task_id == self.task_id:
                self.tasks_done[event.rank] = event
                watch.task_done()
                self.desk.withdraw(event.rank)
                self._post_mortem_over(event.rank)
            return
        if isinstance(event, RankStarted):
            watch.said_started(event.pid)
        elif isinstance(event, RankPrompt):
            self._read_output_now(watch)
            self._on_prompt(event)
        elif isinstance(event, RankResult):
            watch.result = event
            self.desk.withdraw(event.rank)
            self._post_mortem_over(event.rank)
        elif isinstance(event, RankFailed):
            watch.failed = event
            self.desk.withdraw(event.rank)
            counted = self._post_mortems.pop(event.rank, None)
            if watch.rank in self.still_running and self.stopping.is_echo(event):
                return  # how it felt our stop: the view shows the rank stopped when the run ends
            if counted is not None:  # its post-mortem is over: the failure it counted is this one
                counted.event = event
            elif self.status is None:
                if is_interrupt(event):  # Jupyter's interrupt reached the rank too: the launch is stopped
                    self._stop(Status.STOPPED)
                else:
                    self.failures.append(Failure(watch.rank, time.monotonic(), event=event))
        self.deliver(event)

    def _on_exit(self, watches: List[RankWatch]) -> None:
        process = watches[0].handle.process
        self._unregister(process.sentinel)
        # Still unreaped: its process group id cannot be reused yet. Kill whatever the rank left running.
        watches[0].handle.signal_group(signal.SIGKILL)
        process.join()
        for watch in watches:
            if watch.phase.alive:
                self._rank_gone(watch, process.exitcode)
            watch.start_draining(time.monotonic())

    def _rank_gone(self, watch: RankWatch, exitcode: Optional[int], *, stopped_elsewhere: bool = False,
                   process_gone: bool = True) -> None:
        """The process running ``watch``'s rank is gone with ``exitcode``: tell the view, and count a death
        without an exception or an expected result as a failure (unless the launcher, or for an XLA worker
        its pool, stopped it)."""
        handle = watch.handle
        watch.gone(exitcode, time.monotonic(), stopped=watch.rank in self.still_running)
        watch.exited_running = self.policy.running_time(watch.exited_at)
        self.desk.withdraw(watch.rank)
        counted = self._post_mortems.pop(watch.rank, None)
        if counted is not None and watch.failed is None:  # died in its post-mortem, before reporting
            counted.exitcode = exitcode
        # Read what the rank sent before dying, so an exception it managed to send is not mistaken for a
        # silent death.
        while process_gone and handle.events_fd in watch.open_fds and self._fd_ready(handle.events_fd):
            self._read(watch, handle.events_fd)
        stopped = watch.phase is RankPhase.STOPPED or stopped_elsewhere
        self.deliver(RankExited(rank=watch.rank, exitcode=exitcode, signal_name=signal_name(exitcode),
                                stopped=stopped))
        silent = watch.failed is None and (exitcode != 0 or
                                           (watch.result is None and self.expect_result(watch.rank)))
        if silent and self.status is None and not stopped and counted is None:
            self.failures.append(Failure(watch.rank, watch.exited_at, exitcode=exitcode))

    @staticmethod
    def _fd_ready(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])

    def _give_up_pipe(self, watch: RankWatch, fd: int, why: str) -> None:
        """Stop reading a pipe that a process the rank left behind holds open (for this run only, where the rank
        lives on); say so for an output stream."""
        name = watch.open_fds[fd]
        if watch.phase.alive:
            note = still_writing_note(watch.rank, name, why)
        else:
            note = held_open_note(watch.rank, name, why)
            self._close_fd(watch, fd)
        if name in ("stdout", "stderr"):
            self.deliver(OutputLine(rank=watch.rank, stream="stderr", text=note))

    def _close_fd(self, watch: RankWatch, fd: int) -> None:
        name = watch.open_fds.pop(fd)
        watch.drains.pop(fd, None)
        if name == "events":
            watch.events.close()  # files of a result cut short by the rank's death
        if name in watch.partial and watch.partial[name]:
            self.deliver(OutputLine(rank=watch.rank, stream=name, text=watch.partial[name]))
            watch.partial[name] = ""
        self._unregister(fd)
        watch.handle.close_fd(fd)

    def _unregister(self, fd: int) -> None:
        self.selector.unregister(fd)
        if fd in self.urgent.get_map():
            self.urgent.unregister(fd)

    def close_pipes(self) -> None:
        """Close every pipe still open (what is left in them is lost; partial lines are delivered)."""
        for watch in self.watches.values():
            for fd in list(watch.open_fds):
                self._close_fd(watch, fd)

    # ----------------------------------------------------------------------------------- where is each rank

    def _notice_peers_waiting(self, now: float) -> None:
        """A rank ended normally ``peer_wait`` seconds ago while others still run: they may wait for it for ever
        (a collective it never joined; torchrun hangs silently there). Say so once, with where they wait."""
        finished = [watch for watch in self.watches.values() if watch.phase is RankPhase.EXITED
                    and watch.exitcode == 0 and watch.failed is None]
        waiting = sorted(watch.rank for watch in self.alive())
        if not finished or not waiting or self.desk.waiting:
            return
        first = min(finished, key=lambda watch: watch.exited_at)
        seconds = self.policy.running_time(now) - first.exited_running  # time at a prompt is no one's wait
        if seconds < self.peer_wait:
            return
        self._peers_noticed = True
        stacks = self._collect_stacks(STACKS_WAIT)  # the views show each rank's stacks too
        where = "; ".join(f"rank {rank} in {where_waiting(stacks.get(rank, ''))}" for rank in waiting)
        text = (f"rank {first.rank} finished {seconds:.0f} s ago, but {len(waiting)} rank(s) still run, "
                f"perhaps waiting for it: {where}")
        self.deliver(PeersWaiting(rank=-1, finished_rank=first.rank, waiting=waiting, seconds=seconds, text=text))

    def _notice_not_started(self, now: float) -> None:
        """A rank whose process has not run our first line ``start_wait`` seconds after the launch began (a fork
        that inherited a lock another thread of the kernel held, an import stuck on a network file system, an
        actor Ray cannot place): the launch would wait for it in silence. Say so once, in each such rank's output.
        (No stack dump: before its first line, SIGUSR1 would kill it.)"""
        late = [watch for watch in self.watches.values() if watch.phase is RankPhase.STARTING]
        if not late or now - self._created_at < self.start_wait:
            return
        self._start_noticed = True
        for watch in late:
            self.deliver(OutputLine(rank=watch.rank, stream="stderr",
                                    text=not_started_note(watch.rank, watch.pid, now - self._created_at)))

    def request_stacks(self, timeout: float) -> Dict[int, str]:
        """From any thread: every running rank's stacks, collected by the loop (which owns the pipes)."""
        request = _StackRequest(timeout)
        self._stack_requests.put(request)
        request.done.wait(timeout + 2 * TICK_SECONDS + 1.0)
        return request.stacks

    def _serve_stack_requests(self) -> None:
        while not self._stack_requests.empty():
            request = self._stack_requests.get_nowait()
            request.stacks = self._collect_stacks(request.timeout)
            request.done.set()

    def _collect_stacks(self, wait: float) -> Dict[int, str]:
        """Ask every running rank for its stacks (``RankProcess.ask_stacks``: SIGUSR1, faulthandler dumps all its
        threads onto its stacks pipe); read
        until each has answered and gone quiet, or ``wait`` seconds passed. Delivers ``RankStacks``."""
        asked: Dict[int, int] = {}
        signalled = set()
        for rank, watch in self.watches.items():
            # Each process once, answering on the stacks pipe of the first rank it runs (the ranks of an XLA
            # worker are its threads, and its dump shows them all). A pid is a process of its handle's machine
            # (ranks of a cluster may share numbers).
            where = (id(watch.handle.process), watch.pid)
            if watch.answers_stacks and where not in signalled:
                signalled.add(where)
                asked[rank] = len(watch.stacks)
        for rank in list(asked):
            if not self.watches[rank].handle.ask_stacks(self.watches[rank].pid):
                del asked[rank]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._poll(0.05)
            now = time.monotonic()
            if all(len(self.watches[rank].stacks) > mark and now - self.watches[rank].stacks_at >= STACKS_QUIET
                   for rank, mark in asked.items()):
                break
        stacks = {rank: self.watches[rank].stacks[mark:].decode("utf-8", "replace")
                  for rank, mark in asked.items() if len(self.watches[rank].stacks) > mark}
        for rank, text in stacks.items():
            self.deliver(RankStacks(rank=rank, text=fold_inherited_frames(text), full=text))
        return stacks

    # ------------------------------------------------------------------------------------------- prompts

    def _on_prompt(self, event: RankPrompt) -> None:
        self.desk.arrived(event)
        if event.kind == PromptKind.POST_MORTEM and event.rank not in self._post_mortems and self.status is None:
            # The rank failed when its post-mortem began: that is its place in the root-cause order, and the run
            # is not stopped for it until the person is done (its RankFailed follows).
            failure = Failure(event.rank, time.monotonic())
            self._post_mortems[event.rank] = failure
            self.failures.append(failure)
        self._hold_while_prompted()

    def _post_mortem_over(self, rank: int) -> None:
        """``rank`` ended a post-mortem without failing (``Session.debug`` looks at an earlier run's failure)."""
        counted = self._post_mortems.pop(rank, None)
        if counted is not None and counted.event is None and counted in self.failures:
            self.failures.remove(counted)

    def _hold_while_prompted(self) -> None:
        """The timeout's clock stands still while a rank waits at a prompt."""
        if self.desk.waiting:
            self.policy.hold()
        else:
            self.policy.release()

    def _serve_prompts(self) -> None:
        """Ask for the line of the prompt whose turn it is, if any; the loop runs on meanwhile (``ask_while``)."""
        prompt = self.desk.next_prompt()
        if prompt is None or self.status is not None:
            return
        watch = self.watches[prompt.rank]
        try:
            line = ask_while(self.desk.asker, self.desk.label(prompt, self._settle_output(watch)), self._step,
                             lambda: self.status is None and self.desk.is_waiting(prompt))
        except PromptWithdrawn:
            return
        except NoOneTypes as why:
            answer = self.desk.skipped(prompt, str(why))
        else:
            if not self.desk.is_waiting(prompt):  # answered as it went away
                return
            answer = self.desk.answered(prompt, line)
        self._hold_while_prompted()
        if watch.handle.answers is not None:
            try:
                watch.handle.answers.send(answer)
            except OSError:  # the rank is gone: its death is reported as any other
                pass

    def _settle_output(self, watch: RankWatch) -> str:
        """Read what the rank wrote before its prompt (it flushed before asking), so that pdb's lines come first;
        returns its unfinished stdout line (``input("name: ")``'s text before the prompt), taken from the output."""
        self._read_output_now(watch)
        before, watch.partial["stdout"] = watch.partial["stdout"], ""
        return before

    # ------------------------------------------------------------------------------------------- stopping

    def _stop(self, status: Status) -> None:
        """Stop every rank still running (not those idle again or gone), as ``stopping`` does it."""
        self.status = status
        running = [watch for watch in self.watches.values()
                   if watch.phase in (RankPhase.STARTING, RankPhase.RUNNING)]
        # A rank that already raised is ending on its own (a loaded machine can take a while over its exit): it is
        # stopped with the others should it linger, but it is not one of the ranks the stop ended.
        self.still_running = [watch.rank for watch in running if watch.failed is None]
        self.stop_asked_at = time.monotonic()
        self.stopping.begin(self, running)

    def kill_alive(self) -> None:
        """SIGKILL to every rank still alive and to everything in its process group: the last resort."""
        for watch in self.alive():
            watch.handle.signal_group(signal.SIGKILL)
        self.killed_at = time.monotonic()

    def _emergency_stop(self) -> None:
        """Ctrl-C (or an unexpected error in the loop): stop the ranks now and wait for the run to end — bounded
        once every rank got SIGKILL — then ``stopping.abandon``. A second Ctrl-C meanwhile is ignored."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGINT) if main else None
        if previous is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.stop_asked_at is None:
                self._stop(Status.STOPPED)
            self.status = Status.STOPPED
            while not self.ended():
                if (self.killed_at is not None and time.monotonic() >= self.killed_at + KILLED_WAIT
                        and self.alive()):
                    break  # a rank outlives SIGKILL (stuck in the kernel): its pipes are closed below
                self._poll(TICK_SECONDS)
                self._decide(None)
            self._drain()
        finally:
            try:
                self.stopping.abandon(self)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGINT, previous)

    # -------------------------------------------------------------------------------------------- outcome

    def _outcome(self) -> Outcome:
        exitcodes = {rank: watch.exitcode for rank, watch in self.watches.items()}
        results = {rank: _decode_result(rank, watch.result) for rank, watch in self.watches.items()
                   if watch.result is not None}
        if self.failures and self.status in (None, Status.FAILED):
            return Outcome(Status.FAILED, results, root=choose_root_cause(self.failures),
                           still_running=self.still_running, exitcodes=exitcodes)
        return Outcome(self.status or Status.FINISHED, results, still_running=self.still_running, exitcodes=exitcodes,
                       stacks=self._timeout_stacks)


def _decode_result(rank: int, result: RankResult) -> Any:
    try:
        if result.shared is not None:  # its large tensors and arrays, mapped from shared memory
            return result.shared.load(result.payload)
        return pickle.loads(result.payload)
    except Exception as err:
        raise LaunchError(f"the return value of rank {rank} could not be unpickled in the kernel: "
                          f"{type(err).__name__}: {err}", rank=rank) from err


def not_started_note(rank: int, pid: Optional[int], seconds: float) -> str:
    """The line a rank's output gets when it has not started ``seconds`` after its launch began."""
    where = f" (its process, pid {pid}, is there; `py-spy dump --pid {pid}` shows where it waits)" if pid else ""
    return (f"notebook_accel: rank {rank} has not started {seconds:.0f} s after the launch began{where}; "
            f"the launch waits for it: Stop or interrupt to end it (set {START_WAIT_VARIABLE} to say this sooner "
            f"or later)")


def _seconds_from_env(name: str, default: float) -> float:
    """``name``'s seconds from the environment (``default`` when unset or not a number): ``NOTEBOOK_ACCEL_PEER_WAIT``
    (30 by default) before a finished rank's waiting peers are named, ``NOTEBOOK_ACCEL_START_WAIT`` (60) before a
    rank that has not started is."""
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default
