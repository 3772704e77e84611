"""Where a cluster launch's ranks go: one Ray placement group, one bundle per rank, placed by Ray.

Before anything waits, the request is checked against the cluster's nodes (what each *has*, not what is free: a
busy cluster is a wait, a cluster without the resource is an error) and the nodes its autoscaler could add, and
while the group waits to be placed, Ray's own verdict (``INFEASIBLE``, on a cluster that cannot grow) ends the wait
too — a clear ``LaunchConfigError`` naming what is missing, not Ray's silent wait for ever. Once placed, each rank's node gives it torchrun's variables as Ray Train's
``TorchConfig`` does: ranks grouped by node (rank 0's node first), ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` within its
node, ``GROUP_RANK`` the node's index.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from ...errors import LaunchConfigError
from ...formatting import format_bytes
from ...wire.choices import Placement as Strategy
from .connection import alive_nodes, node_labels

WAIT_NOTICE_SECONDS = 3.0     # a placement still pending this long is said (the cluster is busy)
_BYTES = ("memory", "object_store_memory")


@dataclass
class RankPlace:
    """Where one rank runs, and its place among the ranks of its node."""

    rank: int
    bundle: int
    node_id: str
    node_ip: str
    node: str               # its node's short name (``connection.node_labels``)
    local_rank: int
    local_world_size: int
    group_rank: int         # its node's index, in rank order
    group_world_size: int


class PlacementError(LaunchConfigError):
    """The cluster cannot place the ranks as asked (``LaunchConfigError``: nothing was started)."""


def describe_request(world_size: int, resources: Dict[str, float], strategy: str) -> str:
    return f"{world_size} rank(s) × {_resources_text(resources)} with placement={strategy!r}"


def check_feasible(nodes: List[Dict[str, Any]], world_size: int, resources: Dict[str, float], strategy: str) -> None:
    """A ``PlacementError`` naming what is missing when no arrangement of the cluster's nodes (by their total
    resources) can hold the ranks; nothing when one can, however busy the nodes are now."""
    asked = describe_request(world_size, resources, strategy)
    offered = _offered(nodes)
    fits = [node for node in nodes if _holds(node.get("Resources", {}), resources, 1)]
    missing = [name for name, amount in resources.items() if amount > 0
               and not any(node.get("Resources", {}).get(name, 0) >= amount for node in nodes)]
    if missing:
        names = ", ".join(f"{name} {_amount(name, resources[name])}" for name in missing)
        raise PlacementError(f"cannot place {asked}: no node of the cluster has {names} (per rank). The nodes offer: "
                             f"{offered}")
    if not fits:
        raise PlacementError(f"cannot place {asked}: no single node has all of {_resources_text(resources)} at "
                             f"once. The nodes offer: {offered}")
    if strategy == Strategy.STRICT_SPREAD and len(fits) < world_size:
        raise PlacementError(f"cannot place {asked}: STRICT_SPREAD needs {world_size} different nodes that each "
                             f"have {_resources_text(resources)}; the cluster has {len(fits)}. The nodes offer: "
                             f"{offered}")
    if strategy == Strategy.STRICT_PACK and not any(_holds(node.get("Resources", {}), resources, world_size)
                                                    for node in nodes):
        raise PlacementError(f"cannot place {asked}: STRICT_PACK needs one node with {world_size} × "
                             f"{_resources_text(resources)}; none has. The nodes offer: {offered}")
    capacity = sum(_copies(node.get("Resources", {}), resources) for node in fits)
    if capacity < world_size:
        raise PlacementError(f"cannot place {asked}: the whole cluster holds {capacity} such rank(s). The nodes "
                             f"offer: {offered}")


def node_types_to_add(ray: Any, world_size: int) -> List[Dict[str, Any]]:
    """The nodes an autoscaler could add (KubeRay, Anyscale, a cluster launcher's ``max_workers``), as ``ray.nodes()``
    describes nodes — up to ``world_size`` of each type, enough for any placement of the ranks — or none where Ray
    has no autoscaling config. (Ray Train reads the same config to check a request before it waits.)"""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # an older Ray, or no such key: no autoscaler we know of
        return []
    added: List[Dict[str, Any]] = []
    for group in getattr(config, "node_group_configs", None) or []:
        resources = {name: float(amount) for name, amount in dict(group.resources).items()}
        count = world_size if group.max_count < 0 else min(group.max_count, world_size)
        for index in range(count if resources else 0):
            added.append({"NodeID": f"autoscaler-{group.name}-{index}", "Alive": True, "Resources": resources,
                          "NodeManagerHostname": group.name, "Addable": True})
    return added


class RankPlacement:
    """The placement group of one world (one attempt): made, waited for (Stop, timeout and Ray's verdict apply),
    read (``places``) and removed — ``remove`` is called whatever happened.

    Example::

        placement = RankPlacement(ray, world_size=4, resources={"CPU": 1}, strategy="SPREAD")
        placement.wait(stopped=lambda: False, tick=lambda: None)
        places = placement.places()
        ...
        placement.remove()
    """

    def __init__(self, ray: Any, world_size: int, resources: Dict[str, float], strategy: str) -> None:
        from ray.util.placement_group import placement_group

        self.ray = ray
        self.world_size = world_size
        self.resources = resources
        self.strategy = strategy
        self.nodes = alive_nodes(ray)
        self.can_add = node_types_to_add(ray, world_size)
        check_feasible(self.nodes + self.can_add, world_size, resources, strategy)
        self.group = placement_group([dict(resources) for _ in range(world_size)], strategy=strategy)
        self._removed = False

    def wait(self, stopped: Callable[[], bool], tick: Callable[[], None], say: Callable[[str], None]) -> bool:
        """Until the group is placed (True), ``stopped()`` says stop (False), or Ray finds it infeasible (a
        ``PlacementError``). ``tick`` keeps the view's clock; ``say`` tells once that the cluster is busy."""
        ready = self.group.ready()
        started = time.monotonic()
        said = False
        while True:
            done, _ = self.ray.wait([ready], timeout=0.1)
            if done:
                self.ray.get(ready)
                return True
            if stopped():
                return False
            tick()
            state = self._state()
            if state == "INFEASIBLE" and not self.can_add:  # with an autoscaler, INFEASIBLE is about the nodes of now
                # Ray knows better than the totals (what other groups hold for ever, labels, ...); still, our
                # description of the nodes says what they offer.
                check_feasible(alive_nodes(self.ray), self.world_size, self.resources, self.strategy)
                raise PlacementError(f"cannot place {describe_request(self.world_size, self.resources, self.strategy)}"
                                     f": Ray finds it infeasible on this cluster's nodes")
            if not said and time.monotonic() - started >= WAIT_NOTICE_SECONDS:
                said = True
                say(f"waiting for the cluster to free {describe_request(self.world_size, self.resources, self.strategy)}"
                    f" (Ray: {state or 'pending'}); interrupting the kernel (Ctrl-C) ends the wait, as do Stop "
                    f"and the timeout")

    def _state(self) -> Optional[str]:
        from ray.util.placement_group import placement_group_table

        try:
            return placement_group_table(self.group).get("stats", {}).get("scheduling_state")
        except Exception:
            return None

    def places(self) -> List[RankPlace]:
        """Each rank's place: bundles grouped by node (the node of bundle 0 first), so a node's ranks are
        consecutive and its local ranks count from 0, as torchrun and Ray Train number them."""
        from ray.util.placement_group import placement_group_table

        by_bundle = placement_group_table(self.group)["bundles_to_node_id"]
        nodes = {node["NodeID"]: node for node in alive_nodes(self.ray)}
        labels = node_labels(list(nodes.values()))
        order: Dict[str, List[int]] = {}
        for bundle in range(self.world_size):
            order.setdefault(by_bundle[bundle], []).append(bundle)
        places: List[RankPlace] = []
        for group_rank, (node_id, bundles) in enumerate(order.items()):
            node = nodes.get(node_id, {})
            for local_rank, bundle in enumerate(bundles):
                places.append(RankPlace(
                    rank=len(places), bundle=bundle, node_id=node_id,
                    node_ip=node.get("NodeManagerAddress", ""), node=labels.get(node_id, node_id[:8]),
                    local_rank=local_rank, local_world_size=len(bundles), group_rank=group_rank,
                    group_world_size=len(order)))
        return places

    def remove(self) -> None:
        """Give the group's resources back to the cluster (its actors must be killed first); once."""
        if self._removed:
            return
        self._removed = True
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(self.group)
        except Exception:  # the connection is gone (kernel exit): Ray removes a job's groups with it
            pass


def _offered(nodes: List[Dict[str, Any]]) -> str:
    """What each node offers, for a message; the nodes an autoscaler could add once per type, with their number."""
    present = [node for node in nodes if not node.get("Addable")]
    parts = [f"{label}: {_resources_text(node.get('Resources', {}))}"
             for label, node in zip(node_labels(present).values(), present)]
    addable: Dict[str, int] = {}
    for node in nodes:
        if node.get("Addable"):
            key = f"{node['NodeManagerHostname']}: {_resources_text(node.get('Resources', {}))}"
            addable[key] = addable.get(key, 0) + 1
    parts += [f"up to {count} more of type {key} (its autoscaler)" for key, count in addable.items()]
    return "; ".join(parts) or "none"


def _holds(offer: Dict[str, float], resources: Dict[str, float], copies: int) -> bool:
    return all(offer.get(name, 0) >= amount * copies for name, amount in resources.items() if amount > 0)


def _copies(offer: Dict[str, float], resources: Dict[str, float]) -> int:
    """How many bundles of ``resources`` one node's ``offer`` holds."""
    return int(min(offer.get(name, 0) // amount for name, amount in resources.items() if amount > 0))


def _amount(name: str, amount: float) -> str:
    if name in _BYTES:
        return format_bytes(int(amount))
    return f"{amount:g}"


def _resources_text(resources: Dict[str, float]) -> str:
    """``{CPU: 2, GPU: 1, memory: 18 GiB}``: the resources people ask for (Ray's per-node markers left out)."""
    shown = {name: amount for name, amount in resources.items()
             if not name.startswith("node:") and not name.startswith("accelerator_type:")}
    return "{" + ", ".join(f"{name}: {_amount(name, amount)}" for name, amount in sorted(shown.items())) + "}"
