"""Kernel side of a world of Ray ranks: poll every rank's control thread, fail fast, stop, name the dead.

The same loop as the process supervisor's (``backends.processes.supervisor``), over Ray instead of pipes: every
rank has one ``poll`` call in flight on its control thread (it answers as soon as the rank has events, or after
``POLL_WAIT`` seconds), and its ``run`` call resolves when the rank ends. ``ray.wait`` on all of them is the
loop's ``select``. The rules are the local ones, from ``outcome.root_cause``: the first rank to raise or die is the
root cause, after a short window for the others' errors; Stop and the timeout end the world; a timeout first
collects where each rank was.

Stopping a rank: ``KeyboardInterrupt`` in it through its control thread (its ``finally`` blocks run), and after
``TERMINATE_GRACE`` — or at once when it is blocked in a collective, which an interrupt cannot leave —
``ray.kill``, once its last events are polled. A rank whose actor or node dies is named with its node, in the
time Ray takes to tell (a fraction of a second for a lost process or a node that left).
"""
from __future__ import annotations

import queue
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional

from ...errors import LaunchError
from ...outcome.death import TAIL_LINES, quote_last_output
from ...outcome.raising import root_cause_exception
from ...outcome.root_cause import Failure, Outcome, choose_root_cause, is_interrupt, is_system_exit
from ...outcome.stacks import fold_inherited_frames
from ...wire.commands import Interrupt
from ...wire.events import (OutputLine, OutputLines, RankEvent, RankExited, RankFailed, RankResult, RankStacks,
                            RankStarted, Status)
from ..base import StopPolicy
from ..processes.supervisor import (ROOT_CAUSE_WINDOW, STACKS_WAIT, TERMINATE_GRACE, TICK_SECONDS,
                                    _decode_result)
from .world import RayRank

POLL_WAIT = 0.5      # s a rank's poll waits for its first event before answering with none
DRAIN_WAIT = 2.0     # s a stopped rank's last poll may take before its actor is killed anyway


@dataclass
class _StackRequest:
    timeout: float
    done: threading.Event = field(default_factory=threading.Event)
    stacks: Dict[int, str] = field(default_factory=dict)


@dataclass
class RayRankState:
    """What the loop knows of one rank."""

    handle: RayRank
    poll: Any = None                     # the ObjectRef of its poll in flight; None once its events ended
    running: bool = True                 # its ``run`` call has not resolved
    returned: Optional[int] = None       # what ``run`` returned, held until its last events are read
    exited_at: Optional[float] = None    # when it was seen gone (its run resolved, or its actor died)
    exitcode: Optional[int] = None
    failed: Optional[RankFailed] = None
    result: Optional[bytes] = None
    stopped_by_us: bool = False
    killed: bool = False
    death: Optional[str] = None          # how its actor or node died, when it did
    tail: Deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def rank(self) -> int:
        return self.handle.rank

    @property
    def done(self) -> bool:
        return self.exited_at is not None and self.poll is None


class RaySupervisor:
    """Runs the loop over ``ranks`` until each is gone; ``deliver`` receives every event, in order per rank."""

    def __init__(self, ray: Any, ranks: List[RayRank], deliver: Callable[[RankEvent], None],
                 tick: Callable[[], None], *, policy: StopPolicy, expect_results: Callable[[int], bool]) -> None:
        self.ray = ray
        self.ranks = {handle.rank: RayRankState(handle) for handle in ranks}
        self.deliver = deliver
        self.tick = tick
        self.policy = policy
        self.expect_result = expect_results
        self.failures: List[Failure] = []
        self.status: Optional[Status] = None   # set once we decided to stop: FAILED | STOPPED | TIMEOUT
        self.still_running: List[int] = []
        self._interrupted_at: Optional[float] = None
        self._stack_requests: "queue.Queue[_StackRequest]" = queue.Queue()
        self._timeout_stacks: Dict[int, str] = {}
        for state in self.ranks.values():
            state.poll = state.handle.control("poll", POLL_WAIT)

    # ------------------------------------------------------------------------------------------ main loop

    def run(self) -> Outcome:
        """Block until every rank is gone. On KeyboardInterrupt: stop every rank, then re-raise it."""
        try:
            while not all(state.done for state in self.ranks.values()):
                self._poll(TICK_SECONDS)
                self._serve_stack_requests()
                self._decide(self.policy)
                self.tick()
        except BaseException:  # Ctrl-C, or a bug: either way no rank may outlive the launch
            self._emergency_stop()
            raise
        return self._outcome()

    def _calls(self) -> Dict[Any, Any]:
        calls: Dict[Any, Any] = {}
        for state in self.ranks.values():
            if state.poll is not None:
                calls[state.poll] = (state, "poll")
            if state.running:
                calls[state.handle.call] = (state, "run")
        return calls

    def _poll(self, wait: float, *, renew: bool = True) -> None:
        """Handle every call that answered within ``wait`` s; ``renew``: poll those ranks again."""
        calls = self._calls()
        if not calls:
            time.sleep(wait)
            return
        ready, rest = self.ray.wait(list(calls), num_returns=1, timeout=wait)
        if ready and rest:
            more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        # A rank's events before its end: its poll first, then its run's answer.
        for ref in sorted(ready, key=lambda ref: calls[ref][1] != "poll"):
            state, kind = calls[ref]
            if kind == "poll":
                self._on_poll(state, ref, renew=renew)
            else:
                self._on_run(state, ref)

    def _on_poll(self, state: RayRankState, ref: Any, *, renew: bool = True) -> None:
        try:
            events, ended = self.ray.get(ref)
        except Exception as error:  # its actor is gone: nothing more will come
            state.poll = None
            self._actor_gone(state, error)
            return
        for event in events:
            self._on_event(state, event)
        state.poll = None if ended or not renew or state.killed else state.handle.control("poll", POLL_WAIT)
        if ended and not state.running and state.exited_at is None:
            self._rank_gone(state, state.returned)

    def _on_run(self, state: RayRankState, ref: Any) -> None:
        """The rank's ``run`` answered: it is gone once its last events are read too (the result among them)."""
        state.running = False
        try:
            state.returned = self.ray.get(ref)
        except Exception as error:
            self._actor_gone(state, error)
            return
        if state.poll is None and state.exited_at is None:
            self._rank_gone(state, state.returned)

    def _on_event(self, state: RayRankState, event: RankEvent) -> None:
        if isinstance(event, (OutputLine, OutputLines)):
            state.tail.extend(event.texts)
        elif isinstance(event, RankResult):
            state.result = event.payload
        elif isinstance(event, RankFailed):
            if is_interrupt(event) and state.stopped_by_us:
                state.failed = event  # our own interrupt: the rank shows as stopped
                return
            state.failed = event
            if self.status is None:
                if is_interrupt(event):  # a KeyboardInterrupt the function raised itself: a stop, as locally
                    self._stop(Status.STOPPED)
                else:
                    self.failures.append(Failure(state.rank, time.monotonic(), event=event))
        self.deliver(event)

    def _rank_gone(self, state: RayRankState, exitcode: Optional[int]) -> None:
        """The rank's function ended (``exitcode`` as a process rank's), or its actor is gone (None)."""
        state.exitcode = exitcode
        state.exited_at = time.monotonic()
        stopped = state.stopped_by_us
        self.deliver(RankExited(rank=state.rank, exitcode=exitcode, stopped=stopped))
        silent = state.failed is None and (exitcode != 0 or
                                           (state.result is None and self.expect_result(state.rank)))
        if silent and self.status is None and not stopped:
            self.failures.append(Failure(state.rank, state.exited_at, exitcode=exitcode))

    def _actor_gone(self, state: RayRankState, error: BaseException) -> None:
        """Its actor died (or we killed it): read why, and count the rank gone."""
        state.running = False
        if state.exited_at is not None:
            return
        if not state.killed:
            state.death = describe_actor_death(self.ray, state.handle, error)
        self._rank_gone(state, None)

    # ------------------------------------------------------------------------------------------- deciding

    def _decide(self, policy: Optional[StopPolicy]) -> None:
        """Stop (asked), fail (the root cause is known), time out — in that order; then kill what outlived the
        interrupt. ``policy`` is None once the ranks are being stopped anyway (Ctrl-C)."""
        now = time.monotonic()
        if self.status is None:
            reason = policy.reason(now) if policy is not None else None
            if reason == Status.STOPPED:
                self._stop(Status.STOPPED)
            elif self.failures and now - self.failures[0].time >= ROOT_CAUSE_WINDOW:
                self._stop(Status.FAILED)
            elif self.failures and all(state.exited_at is not None for state in self.ranks.values()):
                self.status = Status.FAILED
            if self.status is None and reason == Status.TIMEOUT:
                self._timeout_stacks = self._collect_stacks(STACKS_WAIT)  # where each rank was stuck
                self._stop(Status.TIMEOUT)
        if self._interrupted_at is not None and now - self._interrupted_at >= TERMINATE_GRACE:
            self._kill_alive()

    def _stop(self, status: Status) -> None:
        """``KeyboardInterrupt`` in every running rank; ``_decide`` kills those still there after the grace."""
        self.status = status
        self.still_running = [rank for rank, state in self.ranks.items() if state.exited_at is None]
        for rank in self.still_running:
            self.ranks[rank].stopped_by_us = True
            self.ranks[rank].handle.control("command", Interrupt())
        self._interrupted_at = time.monotonic()

    def _kill_alive(self) -> None:
        """Kill every rank still running, after one last poll of its events (bounded: a rank stuck in C code
        still answers, its control thread runs Python)."""
        alive = [state for state in self.ranks.values() if state.exited_at is None and not state.killed]
        if not alive:
            return
        deadline = time.monotonic() + DRAIN_WAIT
        while any(state.poll is not None for state in alive) and time.monotonic() < deadline:
            self._poll(TICK_SECONDS, renew=False)
        for state in alive:
            if state.exited_at is None:
                state.killed = True
                try:
                    self.ray.kill(state.handle.actor, no_restart=True)
                except Exception:
                    pass

    def _emergency_stop(self) -> None:
        """Ctrl-C (or an error in the loop): interrupt every rank, give them the grace, kill the rest; a second
        Ctrl-C meanwhile is ignored."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGINT) if main else None
        if previous is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self._interrupted_at is None:
                self._stop(Status.STOPPED)
            self.status = Status.STOPPED
            end = time.monotonic() + TERMINATE_GRACE + DRAIN_WAIT + 1.0
            while not all(state.done for state in self.ranks.values()) and time.monotonic() < end:
                self._poll(TICK_SECONDS)
                self._decide(None)
        finally:
            for state in self.ranks.values():
                if state.exited_at is None:
                    state.killed = True
                    try:
                        self.ray.kill(state.handle.actor, no_restart=True)
                    except Exception:
                        pass
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    # ----------------------------------------------------------------------------------- where is each rank

    def request_stacks(self, timeout: float) -> Dict[int, str]:
        """From any thread: every running rank's stacks, collected by the loop."""
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
        """Each running rank's stacks, from its control thread (within ``wait`` s); delivers ``RankStacks``."""
        asked = {state.handle.control("stacks"): state.rank for state in self.ranks.values()
                 if state.exited_at is None}
        stacks: Dict[int, str] = {}
        if asked:
            ready, _ = self.ray.wait(list(asked), num_returns=len(asked), timeout=wait)
            for ref in ready:
                try:
                    stacks[asked[ref]] = self.ray.get(ref)
                except Exception:  # its actor died meanwhile: the loop hears of it
                    pass
        for rank, text in sorted(stacks.items()):
            self.deliver(RankStacks(rank=rank, text=fold_inherited_frames(text), full=text))
        return stacks

    # -------------------------------------------------------------------------------------------- outcome

    def _outcome(self) -> Outcome:
        exitcodes = {rank: state.exitcode for rank, state in self.ranks.items()}
        results = {rank: _decode_result(rank, state.result) for rank, state in self.ranks.items()
                   if state.result is not None}
        if self.failures and self.status in (None, Status.FAILED):
            root = choose_root_cause(self.failures)
            return Outcome(Status.FAILED, results, root=root, still_running=self.still_running, exitcodes=exitcodes,
                           local_exception=self.root_exception(root))
        return Outcome(self.status or Status.FINISHED, results, still_running=self.still_running,
                       exitcodes=exitcodes, stacks=self._timeout_stacks)

    def root_exception(self, root: Failure) -> BaseException:
        """What the kernel raises for ``root``: the rank's own exception (``outcome.raising``'s rule) with its node
        noted, or a ``LaunchError`` naming the rank, its node and how its actor died."""
        state = self.ranks[root.rank]
        node = state.handle.place.node
        if state.death is not None:
            return LaunchError(f"rank {root.rank} on node {node} died: {state.death}"
                               f"{quote_last_output(list(state.tail))}", rank=root.rank)
        error = root_cause_exception(root, len(self.ranks), last_output=list(state.tail), where=f" on node {node}")
        if root.event is not None and not is_system_exit(root.event) and hasattr(error, "add_note"):
            error.add_note(f"(notebook_accel: rank {root.rank} ran on node {node})")
        try:
            error.node = node  # type: ignore[attr-defined]
        except Exception:
            pass
        return error


def describe_actor_death(ray: Any, rank: RayRank, error: BaseException) -> str:
    """Why a rank's actor is gone, in one clause: its node was lost, or its process died (Ray's detail)."""
    text = str(error)
    node_alive = True
    try:
        node_alive = any(node["NodeID"] == rank.place.node_id and node.get("Alive") for node in ray.nodes())
    except Exception:
        pass
    if not node_alive or "node has died" in text or "node died" in text:
        return f"its node ({rank.place.node_ip}, Ray node {rank.place.node_id[:8]}) was lost"
    detail = ""
    for line in text.splitlines():
        if "Worker exit detail:" in line:
            detail = line.split("Worker exit detail:", 1)[1].strip()
            break
        if line.startswith("The actor is dead because") or line.startswith("The actor died because"):
            detail = line.strip()
    if not detail:
        detail = text.strip().splitlines()[-1] if text.strip() else type(error).__name__
    detail = detail.split(" Some common causes", 1)[0]  # Ray's guesses (OOM killer, `ray stop`) are its own
    return f"its Ray actor's process (pid {rank.pid}) ended without a result ({detail.rstrip('.')})"
