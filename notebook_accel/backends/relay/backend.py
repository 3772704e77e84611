"""A launch whose ranks run on other machines, relayed: ``RelayedBackend``, what Ray's and Slurm's backends share.

``run`` is the local sequence with a cluster underneath: ``open_rendezvous`` refuses in the caller's cell what cannot
run (the kernel hosts no store: rank 0 does, on its node); ``_supervise`` runs the attempts (``base.run_attempts``,
``max_restarts`` of the site), each a new world of ranks started for it (``_start_world``: its relay's handles),
watched by the launch's own ``Supervisor`` — the same root cause, Stop, timeout and stack dumps as local ranks — and
ended after (``_end_world``: nothing of an attempt goes on into the next). The root cause is raised naming its rank's
node: a ``LaunchError`` saying how the rank died where it made no event (``death_of``: its actor or node lost, its
task ended), else the rank's own exception, with a note of where it ran (``ran_on``). The earlier attempts' failures
are notes of the last one's.

A subclass fills in only what differs: ``_start_world`` (which sets ``world``, whose ``end()`` ends it), ``node_of``,
``death_of``, optionally ``ran_on``, ``open_rendezvous`` (its checks, then this one's), ``_before_attempts`` (what the
attempts share: a job to run in) and ``_close``.
"""
from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections import defaultdict, deque
from typing import Any, Deque, Dict, List, Optional

from ...errors import LaunchError
from ...outcome.death import TAIL_LINES, quote_last_output
from ...outcome.raising import root_cause_exception
from ...outcome.root_cause import Outcome, is_system_exit
from ...wire.events import OutputLine, OutputLines, RankEvent, Status
from ..base import Backend, LaunchSink, StopPolicy, restartable_failure, run_attempts
from ..supervisor import RankProcess, Supervisor
from .ranks import NoKernelStore


class RelayedBackend(Backend):
    """Every rank on another machine, relayed into local pipes (see the module docstring)."""

    _supervisor: Optional[Supervisor] = None
    world: Any = None   # the current attempt's ranks (what ``_start_world`` started): ``end()`` ends them

    def open_rendezvous(self) -> NoKernelStore:  # type: ignore[override]
        """Rank 0 hosts the store on its node: nothing to host here. A subclass checks what it must first."""
        return NoKernelStore()

    @property
    def max_restarts(self) -> int:
        """Whole-world restarts after a failure (the site's ``max_restarts``)."""
        return int(getattr(self.plan.site, "max_restarts", 0))

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        before = self._before_attempts(sink, policy)
        if before is not None:
            return before
        outcome, history = run_attempts(self.max_restarts, sink.deliver,
                                        lambda attempt: self._run_attempt(attempt, sink, policy), restartable_failure)
        if outcome.local_exception is not None and hasattr(outcome.local_exception, "add_note"):
            for number, line in enumerate(history, start=1):
                outcome.local_exception.add_note(f"(notebook_accel: attempt {number} failed first: {line})")
        return outcome

    def _before_attempts(self, sink: LaunchSink, policy: StopPolicy) -> Optional[Outcome]:
        """What every attempt needs first (a Slurm job); an ``Outcome`` ends the launch before any (stopped)."""
        return None

    def _run_attempt(self, attempt: int, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        """One world, supervised to its end, then ended."""
        tails: Dict[int, Deque[str]] = defaultdict(lambda: deque(maxlen=TAIL_LINES))

        def deliver(event: RankEvent) -> None:  # each rank's last lines, for a death's message
            if isinstance(event, (OutputLine, OutputLines)):
                tails[event.rank].extend(event.texts)
            sink.deliver(event)

        try:
            handles = self._start_world(attempt, sink, policy)
            if handles is None:
                return Outcome(policy.reason() or Status.STOPPED)
            self._supervisor = Supervisor(handles, deliver, sink.tick, policy=policy,
                                          expect_results=self.plan.sends_result, asker=sink.asker)
            try:
                outcome = self._supervisor.run()
            finally:
                self._supervisor = None
            return self._named(outcome, tails)
        finally:
            self._end_world()

    @abstractmethod
    def _start_world(self, attempt: int, sink: LaunchSink, policy: StopPolicy) -> Optional[List[RankProcess]]:
        """Start attempt ``attempt``'s ranks running the launch; the handles the supervisor watches them through
        (its relay's), or None when ``policy`` stopped the start first."""

    def _end_world(self) -> None:
        """End the current world's ranks and its relay, whatever state they are in (idempotent)."""
        world, self.world = self.world, None
        if world is not None:
            world.end()

    @abstractmethod
    def node_of(self, rank: int) -> str:
        """The node ``rank`` of the current world runs on (as messages name it)."""

    def death_of(self, rank: int) -> Optional[str]:
        """How ``rank``, which made no event at its end, died ("its node ... was lost"), or None where the relay
        cannot say (then its exit is reported as a local rank's)."""
        return None

    def ran_on(self, rank: int, node: str) -> str:
        """Where a rank that raised ran, for the note on its exception."""
        return f"rank {rank} ran on node {node}"

    def _named(self, outcome: Outcome, tails: Dict[int, Deque[str]]) -> Outcome:
        """The outcome, its root cause raised naming the rank's node (see the module docstring)."""
        root = outcome.root
        if root is None:
            return outcome
        node = self.node_of(root.rank)
        death = self.death_of(root.rank) if root.event is None else None
        if death is not None:
            error: BaseException = LaunchError(f"rank {root.rank} on node {node} died: {death}"
                                               f"{quote_last_output(list(tails[root.rank]))}", rank=root.rank)
        else:
            error = root_cause_exception(root, self.plan.world_size, last_output=list(tails[root.rank]),
                                         where=f" on node {node}")
            if root.event is not None and not is_system_exit(root.event) and hasattr(error, "add_note"):
                error.add_note(f"(notebook_accel: {self.ran_on(root.rank, node)})")
        try:
            error.node = node  # type: ignore[attr-defined]
        except Exception:
            pass
        return dataclasses.replace(outcome, local_exception=error)

    def _close(self) -> None:
        self._end_world()
        self.plan.payload.close()

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self._supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}
