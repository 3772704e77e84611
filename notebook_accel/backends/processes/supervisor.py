"""Kernel side of a process launch: read every rank's pipes and sentinel, fail fast, stop, clean up.

One loop in one thread (the kernel's main thread for ``notebook_launcher``, so Ctrl-C / Jupyter's interrupt
arrive here as ``KeyboardInterrupt``). It turns bytes into events for the view, decides the root cause of
a failure, and guarantees that when it returns every rank and everything they started is gone.
"""
from __future__ import annotations

import codecs
import os
import pickle
import queue
import select
import selectors
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ...errors import LaunchError
from ...formatting import signal_name
from ...outcome.root_cause import Failure, Outcome, choose_root_cause, is_interrupt
from ...outcome.stacks import fold_inherited_frames, where_waiting
from ...wire.channel import EventDecoder, receive
from ...wire.events import (OutputLine, OutputLines, PeersWaiting, RankEvent, RankExited, RankFailed, RankResult,
                            RankStacks, RankStarted, Status)
from ..draining import PipeDrain, held_open_note

if TYPE_CHECKING:  # pragma: no cover
    from ..base import StopPolicy
    from .backend import RankProcess

TICK_SECONDS = 0.1          # view.tick() cadence, and the longest the loop sleeps
ROOT_CAUSE_WINDOW = 0.25    # after a first failure, how long to collect others before naming the root cause
TERMINATE_GRACE = 1.0       # SIGTERM, then SIGKILL after this
STACKS_WAIT = 2.0           # how long a timeout waits for the ranks' stack dumps
STACKS_QUIET = 0.15         # a dump is complete once its pipe has been quiet this long
# After reading a rank's output, let more of it gather this long before reading output again (events, stacks
# and exits are still read at once). A chatty rank's lines then come in a few large reads instead of one read
# and one wake-up of this loop per write: the kernel's per-line work stops competing with the ranks for the
# cores. A line written after a quiet spell is read at once.
OUTPUT_REST = 0.005
PEER_WAIT_VARIABLE = "NOTEBOOK_ACCEL_PEER_WAIT"  # seconds a rank may have finished while others run, unsaid
DEFAULT_PEER_WAIT = 30.0
_READ_BYTES = 1 << 16
_OUTPUT = ("stdout", "stderr")


@dataclass
class _StackRequest:
    timeout: float
    done: threading.Event = field(default_factory=threading.Event)
    stacks: Dict[int, str] = field(default_factory=dict)


class _RankState:
    def __init__(self, handle: RankProcess) -> None:
        self.handle = handle
        self.open_fds = {handle.stdout_fd: "stdout", handle.stderr_fd: "stderr", handle.events_fd: "events",
                         handle.stacks_fd: "stacks"}
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        self.partial = {"stdout": "", "stderr": ""}
        self.events = EventDecoder()
        self.exited_at: Optional[float] = None
        # Once its process is gone: each pipe read to EOF, or given up when only what the rank left behind
        # holds it open (``backends.draining``).
        self.drains: Dict[int, PipeDrain] = {}
        self.exitcode: Optional[int] = None
        self.failed: Optional[RankFailed] = None
        self.result: Optional[RankResult] = None
        self.stopped_by_us = False
        self.started = False            # sent RankStarted: its SIGUSR1 stack dump is armed
        self.pid = handle.pid           # the process the rank runs in, as its RankStarted says
        self.stacks = bytearray()       # everything faulthandler wrote for this rank's dumps
        self.stacks_at = 0.0            # when the last of it arrived

    @property
    def done(self) -> bool:
        return self.exited_at is not None and not self.open_fds

    def start_draining(self, now: float) -> None:
        """Its process is gone: what is left in its pipes is all it wrote."""
        if not self.drains:
            self.drains = {fd: PipeDrain(fd, now) for fd in self.open_fds}


class Supervisor:
    """Runs the loop for ``ranks`` until all are gone; ``deliver`` receives every event in order."""

    selector_class: type = selectors.DefaultSelector

    def __init__(self, ranks: List[RankProcess], deliver: Callable[[RankEvent], None], tick: Callable[[], None],
                 *, policy: StopPolicy, expect_results: Callable[[int], bool]) -> None:
        self.ranks = {handle.rank: _RankState(handle) for handle in ranks}
        self.deliver = deliver
        self.tick = tick
        self.policy = policy
        self.expect_result = expect_results
        self.peer_wait = _peer_wait()
        self._peers_noticed = False
        self.selector = self.selector_class()
        self.urgent = self.selector_class()   # all but the output pipes: what ``OUTPUT_REST`` never delays
        self._output_rests_until = 0.0
        # Several ranks may live in one process (an XLA host's device threads and workers): one sentinel each.
        carried: Dict[int, List[_RankState]] = {}
        for state in self.ranks.values():
            for fd, name in state.open_fds.items():
                self.selector.register(fd, selectors.EVENT_READ, (state, "pipe"))
                if name not in _OUTPUT:
                    self.urgent.register(fd, selectors.EVENT_READ, (state, "pipe"))
            carried.setdefault(state.handle.process.sentinel, []).append(state)
        for sentinel, states in carried.items():
            self.selector.register(sentinel, selectors.EVENT_READ, (states, "exit"))
            self.urgent.register(sentinel, selectors.EVENT_READ, (states, "exit"))
        self.failures: List[Failure] = []
        self.status: Optional[Status] = None    # set once we decided to stop: FAILED | STOPPED | TIMEOUT
        self.still_running: List[int] = []
        self._terminated_at: Optional[float] = None
        self._killed = False
        self._stack_requests: "queue.Queue[_StackRequest]" = queue.Queue()
        self._timeout_stacks: Dict[int, str] = {}

    # ------------------------------------------------------------------------------------------ main loop

    def run(self) -> Outcome:
        """Block until every rank is gone. On KeyboardInterrupt: stop all ranks, then re-raise it."""
        try:
            while not self._finished():
                self._poll(TICK_SECONDS)
                self._serve_stack_requests()
                self._decide(self.policy)
                self.tick()
            self._drain()
        except BaseException:  # Ctrl-C, or a bug: either way no rank may outlive the launch
            self._emergency_stop()
            raise
        finally:
            self.selector.close()
            self.urgent.close()
        return self._outcome()

    def _finished(self) -> bool:
        """The loop's end: every rank gone and its pipes read to EOF (a warm session's run ends sooner)."""
        return all(state.done for state in self.ranks.values())

    def _drain(self) -> None:
        """Read what is still in the pipes once the loop ended (nothing is: they were read to EOF)."""

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
            elif self.failures and now - self.failures[0].time >= ROOT_CAUSE_WINDOW:
                self._stop(Status.FAILED)
            elif self.failures and all(s.exited_at is not None for s in self.ranks.values()):
                self.status = Status.FAILED
            elif not self.failures and not self._peers_noticed:
                self._notice_peers_waiting(now)  # says it, never ends the launch
            if self.status is None and reason == Status.TIMEOUT:
                self._timeout_stacks = self._collect_stacks(STACKS_WAIT)  # where each rank was stuck
                self._stop(Status.TIMEOUT)
        if self._terminated_at is not None and not self._killed and now - self._terminated_at >= TERMINATE_GRACE:
            self._signal_alive(signal.SIGKILL)
            self._killed = True
        for state in self.ranks.values():  # what a dead rank left running may keep its pipes open
            for fd, drain in list(state.drains.items()):
                why = drain.give_up(self._fd_ready(fd), now) if fd in state.open_fds else None
                if why is not None:
                    self._give_up_pipe(state, fd, why)

    # ------------------------------------------------------------------------------------------- reading

    def _read(self, state: _RankState, fd: int) -> None:
        name = state.open_fds[fd]
        fds: List[int] = []
        try:
            if name == "events":  # a socket: a result's shared-memory files come with its bytes
                chunk, fds = receive(fd, _READ_BYTES)
            else:
                chunk = os.read(fd, _READ_BYTES)
        except OSError:
            chunk = b""
        if fd in state.drains:
            state.drains[fd].got(len(chunk), time.monotonic())
        if name == "events":
            for event in state.events.feed(chunk, fds):
                self._on_event(state, event)
        elif name == "stacks":
            state.stacks += chunk
            state.stacks_at = time.monotonic()
        else:
            self._on_output(state, name, chunk)
        if not chunk:
            self._close_fd(state, fd)

    def _on_output(self, state: _RankState, stream: str, chunk: bytes) -> None:
        text = state.partial[stream] + state.decoders[stream].decode(chunk, final=not chunk)
        lines = text.split("\n")
        state.partial[stream] = lines.pop() if chunk else ""
        if not chunk and lines and lines[-1] == "":  # EOF right after a newline: no extra empty line
            lines.pop()
        if not lines:
            return
        if "\r" in text:  # a progress bar's carriage returns (rare): strip the line ends they leave
            lines = [line.rstrip("\r") for line in lines]
        self.deliver(OutputLines(rank=state.handle.rank, stream=stream, lines=lines))

    def _on_event(self, state: _RankState, event: RankEvent) -> None:
        if isinstance(event, RankExited):
            # The rank ended while the process we started lives on: an XLA device thread returned, or the
            # XLA host reports that a worker it forked (not our child) died. Its pipes stay open until
            # that process is gone: other ranks in it still write there.
            if state.exited_at is None:
                self._rank_gone(state, event.exitcode, stopped_elsewhere=event.stopped, process_gone=False)
            return
        if isinstance(event, RankStarted):
            state.started = True
            state.pid = event.pid  # where the rank runs: an XLA device thread's is a worker, not our child
        elif isinstance(event, RankResult):
            state.result = event
        elif isinstance(event, RankFailed):
            state.failed = event
            if self.status is None:
                if is_interrupt(event):  # Jupyter's interrupt reached the rank too: the launch is stopped
                    self._stop(Status.STOPPED)
                else:
                    self.failures.append(Failure(state.handle.rank, time.monotonic(), event=event))
        self.deliver(event)

    def _on_exit(self, states: List[_RankState]) -> None:
        process = states[0].handle.process
        self._unregister(process.sentinel)
        # Still unreaped: its process group id cannot be reused yet. Kill whatever the rank left running.
        states[0].handle.signal_group(signal.SIGKILL)
        process.join()
        for state in states:
            if state.exited_at is None:
                self._rank_gone(state, process.exitcode)
            state.start_draining(time.monotonic())

    def _rank_gone(self, state: _RankState, exitcode: Optional[int], *, stopped_elsewhere: bool = False,
                   process_gone: bool = True) -> None:
        """The process running ``state``'s rank is gone with ``exitcode``: tell the view, and count a death
        without an exception or an expected result as a failure (unless the launcher, or for an XLA worker
        its pool, stopped it)."""
        handle = state.handle
        state.exitcode = exitcode
        state.exited_at = time.monotonic()
        # Read what the rank sent before dying, so an exception it managed to send is not mistaken for a
        # silent death.
        while process_gone and handle.events_fd in state.open_fds and self._fd_ready(handle.events_fd):
            self._read(state, handle.events_fd)
        stopped = state.stopped_by_us or stopped_elsewhere
        self.deliver(RankExited(rank=handle.rank, exitcode=exitcode, signal_name=signal_name(exitcode),
                                stopped=stopped))
        silent = state.failed is None and (exitcode != 0 or
                                           (state.result is None and self.expect_result(handle.rank)))
        if silent and self.status is None and not stopped:
            self.failures.append(Failure(handle.rank, state.exited_at, exitcode=exitcode))

    @staticmethod
    def _fd_ready(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])

    def _give_up_pipe(self, state: _RankState, fd: int, why: str) -> None:
        """Stop reading a pipe that a process the rank left behind holds open; say so for an output stream."""
        name = state.open_fds[fd]
        self._close_fd(state, fd)
        if name in ("stdout", "stderr"):
            self.deliver(OutputLine(rank=state.handle.rank, stream="stderr",
                                    text=held_open_note(state.handle.rank, name, why)))

    def _close_fd(self, state: _RankState, fd: int) -> None:
        name = state.open_fds.pop(fd)
        state.drains.pop(fd, None)
        if name == "events":
            state.events.close()  # files of a result cut short by the rank's death
        if name in state.partial and state.partial[name]:
            self.deliver(OutputLine(rank=state.handle.rank, stream=name, text=state.partial[name]))
            state.partial[name] = ""
        self._unregister(fd)
        os.close(fd)

    def _unregister(self, fd: int) -> None:
        self.selector.unregister(fd)
        if fd in self.urgent.get_map():
            self.urgent.unregister(fd)

    # ----------------------------------------------------------------------------------- where is each rank

    def _notice_peers_waiting(self, now: float) -> None:
        """A rank ended normally ``peer_wait`` seconds ago while others still run: they may wait for it for ever
        (a collective it never joined; torchrun hangs silently there). Say so once, with where they wait."""
        finished = [state for state in self.ranks.values() if state.exited_at is not None and state.exitcode == 0
                    and state.failed is None and not state.stopped_by_us]
        waiting = sorted(rank for rank, state in self.ranks.items() if state.exited_at is None)
        if not finished or not waiting:
            return
        first = min(finished, key=lambda state: state.exited_at)
        seconds = now - first.exited_at
        if seconds < self.peer_wait:
            return
        self._peers_noticed = True
        stacks = self._collect_stacks(STACKS_WAIT)  # the views show each rank's stacks too
        where = "; ".join(f"rank {rank} in {where_waiting(stacks.get(rank, ''))}" for rank in waiting)
        text = (f"rank {first.handle.rank} finished {seconds:.0f} s ago, but {len(waiting)} rank(s) still run, "
                f"perhaps waiting for it: {where}")
        self.deliver(PeersWaiting(rank=-1, finished_rank=first.handle.rank, waiting=waiting, seconds=seconds,
                                  text=text))

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
        """SIGUSR1 to every running rank (faulthandler dumps all its threads onto its stacks pipe); read
        until each has answered and gone quiet, or ``wait`` seconds passed. Delivers ``RankStacks``."""
        asked: Dict[int, int] = {}
        signalled = set()
        for rank, state in self.ranks.items():
            # Each process once, answering on the stacks pipe of the first rank it runs (the ranks of an XLA
            # worker are its threads, and its dump shows them all).
            if state.started and state.exited_at is None and state.pid not in signalled:
                signalled.add(state.pid)
                asked[rank] = len(state.stacks)
        for rank in list(asked):
            try:
                os.kill(self.ranks[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                del asked[rank]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._poll(0.05)
            now = time.monotonic()
            if all(len(self.ranks[rank].stacks) > mark and now - self.ranks[rank].stacks_at >= STACKS_QUIET
                   for rank, mark in asked.items()):
                break
        stacks = {rank: self.ranks[rank].stacks[mark:].decode("utf-8", "replace")
                  for rank, mark in asked.items() if len(self.ranks[rank].stacks) > mark}
        for rank, text in stacks.items():
            self.deliver(RankStacks(rank=rank, text=fold_inherited_frames(text), full=text))
        return stacks

    # ------------------------------------------------------------------------------------------- stopping

    def _stop(self, status: Status) -> None:
        self.status = status
        self.still_running = [rank for rank, s in self.ranks.items() if s.exited_at is None]
        for rank in self.still_running:
            self.ranks[rank].stopped_by_us = True
        self._signal_alive(signal.SIGTERM)
        self._terminated_at = time.monotonic()

    def _signal_alive(self, sig: int) -> None:
        for state in self.ranks.values():
            if state.exited_at is None:
                state.handle.signal_group(sig)

    def _emergency_stop(self) -> None:
        """Ctrl-C (or an unexpected error in the loop): stop everything now; a second Ctrl-C during this is
        ignored until the ranks are gone."""
        previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
        if previous is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.status = Status.STOPPED
            if self._terminated_at is None:
                self._stop(Status.STOPPED)
            # Bounded while a rank outlives SIGKILL; its pipes are then read as at a normal end (to EOF).
            end = time.monotonic() + TERMINATE_GRACE + 1.0
            while not all(state.done for state in self.ranks.values()):
                if time.monotonic() > end and any(state.exited_at is None for state in self.ranks.values()):
                    break
                self._poll(TICK_SECONDS)
                self._decide(None)
        finally:
            self._signal_alive(signal.SIGKILL)
            for state in self.ranks.values():
                state.handle.process.join(1.0)
                for fd in list(state.open_fds):
                    self._close_fd(state, fd)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    # -------------------------------------------------------------------------------------------- outcome

    def _outcome(self) -> Outcome:
        exitcodes = {rank: state.exitcode for rank, state in self.ranks.items()}
        results = {rank: _decode_result(rank, state.result) for rank, state in self.ranks.items()
                   if state.result is not None}
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


def _peer_wait() -> float:
    """``NOTEBOOK_ACCEL_PEER_WAIT`` seconds (30 by default) before a finished rank's waiting peers are named."""
    try:
        return max(0.0, float(os.environ.get(PEER_WAIT_VARIABLE, DEFAULT_PEER_WAIT)))
    except ValueError:
        return DEFAULT_PEER_WAIT
