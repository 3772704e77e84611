"""One attempt of a multi-node launch, seen from one node: failures published through the shared store
(ordered by a sequence number from the store, no clocks), a Stop or a failure anywhere stopping every node,
and node liveness from the launchers' heartbeats."""
from __future__ import annotations

import dataclasses
import pickle
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional

from ...outcome.death import TAIL_LINES, describe_death
from ...outcome.root_cause import is_collateral, is_interrupt
from ...plan.nodes import NodeOptions
from ...wire.events import OutputLine, OutputLines, RankEvent, RankExited, RankFailed, Status

_LIVENESS_SECONDS = 1.0      # how often a node checks that the others' launchers still beat


@dataclass
class NodeFailure:
    """A failure candidate as published through the shared store; ``seq`` orders them over all nodes."""

    seq: int
    node: int
    host: str
    attempt: int
    rank: int
    event: Optional[RankFailed] = None   # None: the rank died without an exception
    exitcode: Optional[int] = None
    tail: List[str] = dataclasses.field(default_factory=list)
    lost_after: Optional[float] = None   # set when the whole node stopped responding (rank is then -1)

    @property
    def collateral(self) -> bool:
        return self.event is not None and is_collateral(self.event)

    def describe(self) -> str:
        """One line: ``rank 3 on node 1 (host-b): ValueError: boom``."""
        if self.lost_after is not None:
            return (f"node {self.node} stopped responding for {self.lost_after:g} s "
                    f"(its kernel, launcher or machine is gone?)")
        if self.event is not None:
            first_line = (self.event.message.strip().splitlines() or [""])[0]
            what = f"{self.event.exc_type.rpartition('.')[2]}: {first_line}"
        else:
            what = describe_death(self.exitcode)
        return f"rank {self.rank} on node {self.node} ({self.host}): {what}"


class AttemptWatch:
    """Between this node's supervisor and the view for one attempt: publishes this node's failures and
    interrupts, and stops this node's ranks once another node aborted the attempt."""

    def __init__(self, store, prefix: str, node: int, attempt: int, deliver: Callable[[RankEvent], None],
                 tick: Callable[[], None], user_stop: threading.Event, options: NodeOptions) -> None:
        self.store = store
        self.num_nodes = options.num_nodes
        self.silence_limit = options.node_timeout
        self.ended_nodes: set = set()      # other nodes known to have ended this attempt
        self.lost_nodes: set = set()       # other nodes whose launcher stopped beating
        self._beats: Dict[int, tuple] = {}  # node -> (its beat count, when we saw it change)
        self._liveness_at = time.monotonic()
        self.prefix = prefix
        self.node = node
        self.host = socket.gethostname()
        self.attempt = attempt
        self._deliver = deliver
        self._tick = tick
        self.user_stop = user_stop
        self.interval = options.monitor_interval
        self.stop = threading.Event()      # the local supervisor's stop_requested
        self.published = 0
        self.store_error: Optional[str] = None
        self._failed_ranks: set = set()
        self._tails: Dict[int, Deque[str]] = defaultdict(lambda: deque(maxlen=TAIL_LINES))
        self._checked_at = 0.0

    # ------------------------------------------------------------------------------- the sink's side
    def deliver(self, event: RankEvent) -> None:
        if isinstance(event, (OutputLine, OutputLines)):
            self._tails[event.rank].extend(event.texts)
        elif isinstance(event, RankFailed):
            self._failed_ranks.add(event.rank)
            if is_interrupt(event):
                self.abort(Status.STOPPED)
            else:
                self.publish(event.rank, event=event)
        elif isinstance(event, RankExited):
            if not event.stopped and event.exitcode != 0 and event.rank not in self._failed_ranks:
                self.publish(event.rank, exitcode=event.exitcode)
        self._deliver(event)

    def tick(self) -> None:
        self._tick()
        now = time.monotonic()
        if now - self._checked_at < self.interval:
            return
        self._checked_at = now
        if self.user_stop.is_set():
            self.abort(Status.STOPPED)
            self.stop.set()
        elif self.aborted() is not None:
            self.stop.set()
        try:
            self.store.add(self.key(f"beat/{self.node}"), 1)  # "this node's launcher is alive"
        except Exception as err:
            self._lost(err)
        if now - self._liveness_at >= _LIVENESS_SECONDS:
            self._liveness_at = now
            self.check_nodes(now)

    def check_nodes(self, now: float) -> None:
        """Notice other nodes whose launcher stopped beating (a killed kernel, a lost machine): they will
        never say they ended, so they are published as a failure and no longer waited for."""
        for other in range(self.num_nodes):
            if other == self.node or other in self.lost_nodes or other in self.ended_nodes:
                continue
            try:
                if self.store.check([self.key(f"ended/{other}")]):
                    self.ended_nodes.add(other)
                    continue
                count = int(self.store.add(self.key(f"beat/{other}"), 0))
            except Exception as err:
                self._lost(err)
                return
            seen = self._beats.get(other)
            if seen is None or seen[0] != count:
                self._beats[other] = (count, now)
            elif now - seen[1] > self.silence_limit:
                self.lost_nodes.add(other)
                self.publish_record(NodeFailure(0, other, "?", self.attempt, -1, lost_after=round(now - seen[1])))

    def all_ended(self) -> bool:
        """Every node said it ended this attempt, or was found lost."""
        waiting = [other for other in range(self.num_nodes) if other not in self.lost_nodes]
        return bool(self.store.check([self.key(f"ended/{other}") for other in waiting]))

    def say_ended(self) -> None:
        self.store.set(self.key(f"ended/{self.node}"), "1")

    # ------------------------------------------------------------------------------- the store's side
    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def publish(self, rank: int, event: Optional[RankFailed] = None, exitcode: Optional[int] = None) -> None:
        """Add a failure candidate; its sequence number orders it among every node's."""
        self.publish_record(NodeFailure(0, self.node, self.host, self.attempt, rank, event, exitcode,
                                        list(self._tails[rank])))

    def publish_record(self, record: NodeFailure) -> None:
        try:
            record.seq = int(self.store.add(self.key("failures"), 1))
            self.store.set(self.key(f"failure/{record.seq}"), pickle.dumps(record))
            self.published += 1
        except Exception as err:
            self._lost(err)
        self.abort(Status.FAILED)

    def abort(self, reason: str) -> None:
        """Tell every node to stop this attempt; the first reason given wins."""
        try:
            self.store.compare_set(self.key("abort"), "", f"{reason}:{self.node}")
        except Exception as err:
            self._lost(err)

    def aborted(self) -> Optional[str]:
        try:
            if self.store.check([self.key("abort")]):
                return self.store.get(self.key("abort")).decode()
        except Exception as err:
            self._lost(err)
            return "lost:-1"
        return None

    def _lost(self, err: Exception) -> None:
        if self.store_error is None:
            self.store_error = f"{type(err).__name__}: {err}"
        self.stop.set()


@dataclass
class AttemptEnd:
    """How one attempt ended for the whole world (every node computes the same)."""

    status: Status                       # FINISHED | FAILED | STOPPED | TIMEOUT
    root: Optional[NodeFailure] = None
    by_node: Optional[int] = None        # who stopped it or let it time out
    node_lost: int = 0                   # nodes that stopped responding: the world cannot run again
