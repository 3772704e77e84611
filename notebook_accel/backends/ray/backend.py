"""Ranks on a Ray cluster (``cluster="ray"``): Ray places them, our events and rules supervise them.

``RayBackend.run`` is the local sequence with Ray underneath: connect (the kernel's ``ray.init``, else one made
here) and check the request against the cluster's nodes in the caller's cell; put the function and its arguments
into Ray's object store once (every rank of a node reads them from its shared memory); then for each attempt a
``RayWorld`` — placement group, actors, torchrun's environment — whose ranks the launch's own ``Supervisor``
watches through their relay (``relay``: the same root cause, Stop, timeout, stack dumps as local ranks) until
every rank is gone, and killed with its group after. A rank whose actor or node died is named with its node. With
``max_restarts``, a failed world is replaced by a new one that Ray places afresh: on the nodes that are left when
one was lost.
"""
from __future__ import annotations

import sys
from typing import Any, Deque, Dict, Optional

import dataclasses
from collections import defaultdict, deque

from ...errors import LaunchError
from ...outcome.death import TAIL_LINES, quote_last_output
from ...outcome.raising import root_cause_exception
from ...outcome.root_cause import Outcome, is_system_exit
from ...plan.plan import LaunchPlan
from ...plan.sites import RayCluster
from ...wire.events import OutputLine, OutputLines, RankEvent, Status
from ..base import Backend, LaunchSink, StopPolicy, restartable_failure, run_attempts
from ..relay import NoKernelStore
from ..supervisor import Supervisor
from .connection import alive_nodes, connect
from .placement import check_feasible, node_types_to_add
from .world import RayWorld


def say(text: str) -> None:
    """A line for the user from the kernel side (the cell's stderr)."""
    print(f"notebook_accel: {text}", file=sys.stderr)


class RayBackend(Backend):
    """Every rank a Ray actor in one placement group (see the module docstring).

    Example::

        notebook_launcher(train, num_processes=8, cluster="ray", resources_per_rank={"GPU": 1, "CPU": 4})
    """

    name = "ray"

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__(plan)
        assert isinstance(plan.site, RayCluster)
        self.cluster: RayCluster = plan.site
        self.ray: Any = None
        self._payload: Any = None        # the ObjectRef of the function and its arguments
        self._world: Optional[RayWorld] = None
        self._supervisor: Optional[Supervisor] = None

    def open_rendezvous(self) -> NoKernelStore:  # type: ignore[override]
        """Connect, and refuse what the cluster's nodes cannot hold — in the caller's cell, before anything waits."""
        self.ray = connect()
        cluster, size = self.cluster, self.plan.world_size
        nodes = alive_nodes(self.ray) + node_types_to_add(self.ray, size)
        check_feasible(nodes, size, cluster.resources_per_rank, cluster.placement)
        return NoKernelStore()

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        if self.ray is None:
            self.open_rendezvous()
        self._payload = self.ray.put(self.plan.payload.portable())  # once, for every rank and attempt

    def _supervise(self, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        outcome, history = run_attempts(self.cluster.max_restarts, sink.deliver,
                                        lambda attempt: self._run_world(attempt, sink, policy), restartable_failure)
        if outcome.local_exception is not None and hasattr(outcome.local_exception, "add_note"):
            for number, line in enumerate(history, start=1):
                outcome.local_exception.add_note(f"(notebook_accel: attempt {number} failed first: {line})")
        return outcome

    def _run_world(self, attempt: int, sink: LaunchSink, policy: StopPolicy) -> Outcome:
        world = RayWorld(self.ray, self.plan, attempt)
        self._world = world
        tails: Dict[int, Deque[str]] = defaultdict(lambda: deque(maxlen=TAIL_LINES))

        def deliver(event: RankEvent) -> None:  # each rank's last lines, for a death's message
            if isinstance(event, (OutputLine, OutputLines)):
                tails[event.rank].extend(event.texts)
            sink.deliver(event)

        try:
            stopped = lambda: policy.reason() is not None  # noqa: E731
            if not world.place(stopped, sink.tick, say) or not world.start_actors(stopped, sink.tick):
                return Outcome(policy.reason() or Status.STOPPED)
            handles = world.run(self._payload, no_one_types=sink.asker.absent)
            self._supervisor = Supervisor(handles, deliver, sink.tick, policy=policy,
                                          expect_results=self.plan.sends_result, asker=sink.asker)
            outcome = self._supervisor.run()
            return self._named(outcome, world, tails)
        finally:
            self._supervisor = None
            world.kill()
            self._world = None

    def _named(self, outcome: Outcome, world: RayWorld, tails: Dict[int, Deque[str]]) -> Outcome:
        """The outcome, its root cause raised naming the rank's node: a ``LaunchError`` saying how its actor or node
        died, or the rank's own exception with a note."""
        root = outcome.root
        if root is None:
            return outcome
        node = world.ranks[root.rank].place.node
        death = world.death(root.rank) if root.event is None else None
        if death is not None:
            error: BaseException = LaunchError(f"rank {root.rank} on node {node} died: {death}"
                                               f"{quote_last_output(list(tails[root.rank]))}", rank=root.rank)
        else:
            error = root_cause_exception(root, self.plan.world_size, last_output=list(tails[root.rank]),
                                         where=f" on node {node}")
            if root.event is not None and not is_system_exit(root.event) and hasattr(error, "add_note"):
                error.add_note(f"(notebook_accel: rank {root.rank} ran on node {node})")
        try:
            error.node = node  # type: ignore[attr-defined]
        except Exception:
            pass
        return dataclasses.replace(outcome, local_exception=error)

    def _close(self) -> None:
        if self._world is not None:
            self._world.kill()
        self._payload = None  # the object store frees it once no rank holds it
        self.plan.payload.close()

    def dump_stacks(self, timeout: float = 2.0) -> Dict[int, str]:
        supervisor = self._supervisor
        return supervisor.request_stacks(timeout) if supervisor is not None else {}
