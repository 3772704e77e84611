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
from typing import Any, Dict, List, Optional

from ...plan.plan import LaunchPlan
from ...plan.sites import RayCluster
from ..base import LaunchSink, StopPolicy
from ..relay import NoKernelStore, RelayedBackend
from ..supervisor import RankProcess
from .connection import alive_nodes, connect
from .placement import check_feasible, node_types_to_add
from .world import RayWorld


def say(text: str) -> None:
    """A line for the user from the kernel side (the cell's stderr)."""
    print(f"notebook_accel: {text}", file=sys.stderr)


class RayBackend(RelayedBackend):
    """Every rank a Ray actor in one placement group (see the module docstring); the attempts, their supervision and
    the root cause named with its node are ``relay.RelayedBackend``'s.

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
        self.world: Optional[RayWorld] = None

    def open_rendezvous(self) -> NoKernelStore:  # type: ignore[override]
        """Connect, and refuse what the cluster's nodes cannot hold — in the caller's cell, before anything waits."""
        self.ray = connect()
        cluster, size = self.cluster, self.plan.world_size
        nodes = alive_nodes(self.ray) + node_types_to_add(self.ray, size)
        check_feasible(nodes, size, cluster.resources_per_rank, cluster.placement)
        return super().open_rendezvous()

    def _start(self, rendezvous_env: Dict[str, str], sink: LaunchSink) -> None:
        if self.ray is None:
            self.open_rendezvous()
        self._payload = self.ray.put(self.plan.payload.portable())  # once, for every rank and attempt

    def _start_world(self, attempt: int, sink: LaunchSink, policy: StopPolicy) -> Optional[List[RankProcess]]:
        """One attempt: a new placement group (Ray places it afresh), an actor per rank, every one running the
        launch."""
        world = self.world = RayWorld(self.ray, self.plan, attempt)
        stopped = lambda: policy.reason() is not None  # noqa: E731
        if not world.place(stopped, sink.tick, say) or not world.start_actors(stopped, sink.tick):
            return None
        return list(world.run(self._payload, no_one_types=sink.asker.absent))

    def node_of(self, rank: int) -> str:
        return self.world.ranks[rank].place.node if self.world is not None else "?"

    def death_of(self, rank: int) -> Optional[str]:
        return self.world.death(rank) if self.world is not None else None

    def _close(self) -> None:
        super()._close()
        self._payload = None  # the object store frees it once no rank holds it
