"""A rank's actor as the kernel holds it: ``rank.actor.RankActor`` made a Ray actor, and calls to its control thread."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ...rank.network import RankNetwork
from .placement import RankPlace

_actor_class: Any = None


@dataclass
class RayRank:
    """A started rank: its place, its actor and (once running) the call that runs it."""

    place: RankPlace
    actor: Any
    pid: int = 0
    gpus: Optional[str] = None
    call: Any = None                 # the ObjectRef of ``run`` (or a session's ``serve``): resolves when it ends
    env: Dict[str, str] = field(default_factory=dict)
    network: Optional[RankNetwork] = None   # its node's address and interface, as the actor found them there

    @property
    def rank(self) -> int:
        return self.place.rank

    def control(self, method: str, *args: Any) -> Any:
        """Call one of the actor's control-thread methods (``poll``, ``stacks``, ``command``), which run beside the
        rank in concurrency groups of their own (``remote_rank``): an ObjectRef."""
        return getattr(self.actor, method).remote(*args)


def actor_class(ray: Any) -> Any:
    """``RankActor`` as a Ray actor class with its control concurrency groups (made once per kernel)."""
    global _actor_class
    if _actor_class is None:
        from .remote_rank import CONCURRENCY_GROUPS, RankActor

        _actor_class = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(RankActor)
    return _actor_class


def actor_resources(resources: Dict[str, float]) -> Dict[str, Any]:
    """``resources_per_rank`` as ``ray.remote`` options: CPU, GPU and memory by their own names, the rest as
    custom resources."""
    options: Dict[str, Any] = {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0)}
    if "memory" in resources:
        options["memory"] = resources["memory"]
    custom = {name: amount for name, amount in resources.items() if name not in ("CPU", "GPU", "memory")}
    if custom:
        options["resources"] = custom
    return options
