"""One world of ranks on a Ray cluster: a placement group, one ``RankActor`` per bundle, their environment.

Started in this order, each step bounded by Stop and the timeout: the placement group (``placement``), the actors
(one per bundle; each says its pid and the GPUs Ray gave it), rank 0's actor hosting the store every rank meets at
(a port it holds on its node), then each rank's environment as torchrun's and Ray Train's ``TorchConfig``: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` by node, ``GROUP_RANK`` the node's index, ``MASTER_ADDR`` rank
0's node and ``MASTER_PORT`` its store, ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` the interface that carries the
rank's node address on that node (unless the node's environment sets them: ``rank.network``), and on GPUs ``CUDA_VISIBLE_DEVICES`` the GPUs of all the node's ranks so
that ``LOCAL_RANK`` indexes the rank's own (as Ray Train shares them, for NCCL's peer-to-peer paths).

``kill`` ends every actor (``ray.kill``: the actor's process, whatever it runs) and removes the group; the backend
calls it after every world, and an ``atexit`` handler for worlds still up when the kernel exits (Ray also ends a
driver's actors and groups when it disconnects).
"""
from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional

from ...errors import LaunchError
from ...plan.plan import LaunchPlan
from ...plan.sites import RayCluster
from ...rank.actor import ActorRankSpec
from ..relay import RelayedRankProcess
from .actors import RayRank, actor_class, actor_resources
from .placement import RankPlacement
from .relay import ActorRelay

_live_worlds: "weakref.WeakSet[RayWorld]" = weakref.WeakSet()
_lock = threading.Lock()


class RayWorld:
    """The ranks of one attempt (see the module docstring).

    Example::

        world = RayWorld(ray, plan, attempt=0)
        try:
            if world.place(stopped, tick, say) and world.start_actors(stopped, tick):
                handles = world.run(payload_ref)      # what the supervisor watches
                ...
        finally:
            world.kill()
    """

    def __init__(self, ray: Any, plan: LaunchPlan, attempt: int = 0) -> None:
        assert isinstance(plan.site, RayCluster)
        self.ray = ray
        self.plan = plan
        self.cluster: RayCluster = plan.site
        self.attempt = attempt
        self.placement: Optional[RankPlacement] = None
        self.ranks: List[RayRank] = []
        self.store_port: Optional[int] = None
        self.relay: Optional[ActorRelay] = None
        with _lock:
            _live_worlds.add(self)

    # ------------------------------------------------------------------------------------------- start

    def place(self, stopped: Callable[[], bool], tick: Callable[[], None], say: Callable[[str], None]) -> bool:
        """Make the placement group and wait until Ray placed it (False: stopped first)."""
        cluster = self.cluster
        self.placement = RankPlacement(self.ray, self.plan.world_size, cluster.resources_per_rank, cluster.placement)
        return self.placement.wait(stopped, tick, say)

    def start_actors(self, stopped: Callable[[], bool], tick: Callable[[], None]) -> bool:
        """One actor per bundle; wait until each is up (False: stopped first); rank 0 hosts the store."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        assert self.placement is not None
        cls = actor_class(self.ray)
        options = actor_resources(self.cluster.resources_per_rank)
        for place in self.placement.places():
            strategy = PlacementGroupSchedulingStrategy(self.placement.group, placement_group_bundle_index=place.bundle)
            actor = cls.options(scheduling_strategy=strategy, max_restarts=0, max_task_retries=0,
                                **options).remote(place.rank, place.node)
            self.ranks.append(RayRank(place, actor))
        described = self.wait_all([rank.actor.describe.remote(rank.place.node_ip) for rank in self.ranks], stopped,
                                  tick, what="start its actor")
        if described is None:
            return False
        for rank, description in zip(self.ranks, described):
            rank.pid, rank.gpus, rank.network = description["pid"], description["gpus"], description.get("network")
        port = self.wait_all([self.ranks[0].actor.host_store.remote(self.plan.world_size)], stopped, tick,
                             what="host the rendezvous store")
        if port is None:
            return False
        self.store_port = port[0]
        for rank in self.ranks:
            rank.env = self.rank_env(rank)
        return True

    def rank_env(self, rank: RayRank) -> Dict[str, str]:
        """torchrun's variables for ``rank`` by its node, the launch's own, and the store rank 0 hosts."""
        place, plan = rank.place, self.plan
        first = self.ranks[0].place
        rendezvous = {"MASTER_ADDR": first.node_ip, "MASTER_PORT": str(self.store_port),
                      "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(self.attempt),
                      "TORCHELASTIC_MAX_RESTARTS": str(self.cluster.max_restarts),
                      "GROUP_WORLD_SIZE": str(place.group_world_size)}
        env = plan.rank_env(place.rank, rendezvous)
        env.update(LOCAL_RANK=str(place.local_rank), LOCAL_WORLD_SIZE=str(place.local_world_size),
                   GROUP_RANK=str(place.group_rank))
        if rank.network is not None:  # gloo's interface: the one carrying the node's address (``rank.network``)
            env.update(rank.network.env)
        node_gpus = [other.gpus for other in self.ranks if other.place.node_id == place.node_id and other.gpus]
        if node_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus)
        return env

    def spec(self, rank: RayRank, **more: Any) -> ActorRankSpec:
        return ActorRankSpec(rank=rank.rank, world_size=self.plan.world_size, env=rank.env,
                             send_result=self.plan.sends_result(rank.rank), node=rank.place.node, **more)

    def run(self, payload_ref: Any, no_one_types: Optional[str] = None) -> List[RelayedRankProcess]:
        """Every rank runs the launched function (its ``run`` call resolves when it ends); the handles the
        supervisor watches them through. ``no_one_types``: why no one can answer the ranks' prompts, if so."""
        for rank in self.ranks:
            spec = self.spec(rank, no_one_types=no_one_types, post_mortem=self.plan.post_mortem)
            rank.call = rank.actor.run.remote(spec, payload_ref)
        return self._relay()

    def serve(self, group_backend: Optional[str], generation: int) -> List[RelayedRankProcess]:
        """Every rank becomes a warm session's rank: joins the process group, then serves tasks."""
        for rank in self.ranks:
            spec = self.spec(rank, group_backend=group_backend, group_generation=generation)
            rank.call = rank.actor.serve.remote(spec)
        return self._relay()

    def _relay(self) -> List[RelayedRankProcess]:
        self.relay = ActorRelay(self.ray, self.ranks)
        return self.relay.handles

    def death(self, rank: int) -> Optional[str]:
        """How rank ``rank``'s actor or node died (not killed by us), or None."""
        return self.relay.death(rank) if self.relay is not None else None

    def wait_all(self, refs: List[Any], stopped: Callable[[], bool], tick: Callable[[], None],
                 what: str) -> Optional[List[Any]]:
        """The values of ``refs`` (one per rank, in order), ticking; None when stopped first. A rank whose actor
        cannot do ``what`` is a ``LaunchError`` naming the rank and its node."""
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=len(pending), timeout=0.1)
            if pending and stopped():
                return None
            tick()
        values = []
        for index, ref in enumerate(refs):
            try:
                values.append(self.ray.get(ref))
            except Exception as err:
                place = self.ranks[index].place if index < len(self.ranks) else None
                where = f" on node {place.node}" if place is not None else ""
                raise LaunchError(f"rank {index}{where} could not {what}: {type(err).__name__}: {err}",
                                  rank=index) from None
        return values

    # ------------------------------------------------------------------------------------------- end

    def kill(self) -> None:
        """End every actor and remove the placement group (idempotent; Ray's errors ignored: a gone connection
        took them with it)."""
        for rank in self.ranks:
            try:
                self.ray.kill(rank.actor, no_restart=True)
            except Exception:
                pass
        if self.relay is not None:
            self.relay.close()
        if self.placement is not None:
            self.placement.remove()
        with _lock:
            _live_worlds.discard(self)

    end = kill   # as ``relay.RelayedBackend`` ends a world


@atexit.register
def _kill_live_worlds() -> None:
    """The kernel exits: nothing of ours stays on the cluster."""
    with _lock:
        worlds = list(_live_worlds)
    for world in worlds:
        world.kill()
