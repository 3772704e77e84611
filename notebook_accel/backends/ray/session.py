"""A warm session's ranks on a Ray cluster (``Session(cluster="ray")``): actors that stay up across runs and cells.

``SessionRayActors`` is ``relay.RelayedWarmRanks`` on a Ray cluster, as ``backends.session.SessionProcesses`` is
locally, so ``Session`` and its rules — a run supervised until every rank is idle, interrupted ranks, a process group
cut and replaced, ranks recreated with "state lost" — apply unchanged. Underneath: one ``RayWorld`` for the session's
life, each rank's actor running ``RankActor.serve`` (the task loop of ``rank.session``), its relay carrying events into
the pipes the supervisors read. A command goes to a rank through its control thread; a run's function and its large
tensors go into Ray's object store once for every rank (``PortablePayload``). Ranks are interrupted by a command (Ray
runs them in a thread of the actor: no signal reaches them), and a process group is cut by each rank closing the
connections its own join made (its peers' pids are on other machines).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ...wire.commands import Command, RunFunction
from ..relay import RelayedWarmRanks
from ..supervisor import RankProcess
from .backend import RayBackend, say
from .world import RayWorld


class SessionRayActors(RelayedWarmRanks):
    """The ranks of ``Session(cluster="ray")``: see the module docstring.

    Example (what ``Session`` does)::

        actors = SessionRayActors(plan, group_backend="gloo", group_generation=0)
        handles = actors.start({})           # placed, up, serving; the supervisors watch the handles
        ...
        actors.kill()                        # actors killed, placement group removed
    """

    name = "session-ray"
    backend_class = RayBackend
    backend: RayBackend
    world: Optional[RayWorld] = None
    _stored: Tuple[Any, Any] = (None, None)   # (command, its ObjectRef): the last run's, put once

    def _start_world(self) -> List[RankProcess]:
        """Place the ranks, start their actors and their task loops (joining the group is the session's first
        task, which ``Session`` waits for)."""
        self.backend.open_rendezvous()
        world = self.world = RayWorld(self.backend.ray, self.plan)
        never = lambda: False  # noqa: E731  (Session bounds the start by its own first task's timeout)
        if not world.place(never, lambda: None, say) or not world.start_actors(never, lambda: None):
            raise RuntimeError("the session's ranks could not be placed")
        return list(world.serve(self.group_backend, self.group_generation))

    def _send(self, rank: int, command: Command) -> bool:
        """To the rank's control thread; a run's command with large data is put into the object store once,
        however many ranks it is sent to."""
        relay = self.world.relay if self.world is not None else None
        if relay is None:
            return False
        relay.command(rank, self.stored(command))
        return True

    def stored(self, command: Command) -> Any:
        """What the rank's control thread is given for ``command``: the command itself, or for a run with large
        data the ObjectRef of the one copy in the object store."""
        if not (isinstance(command, RunFunction) and command.blobs):
            return command
        if self._stored[0] is not command:
            self._stored = (command, self.backend.ray.put(command))
        return self._stored[1]

    def node_of(self, rank: int) -> Optional[str]:
        return self.world.ranks[rank].place.node if self.world is not None else None

    def network_of(self, rank: int) -> Optional[str]:
        network = self.world.ranks[rank].network if self.world is not None else None
        return network.describe() if network is not None else None

    def _end_world(self) -> None:
        """End every actor now, remove the placement group."""
        world, self.world = self.world, None
        if world is not None:
            world.kill()

    def close(self) -> None:
        self._stored = (None, None)
