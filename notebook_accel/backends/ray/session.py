"""A warm session's ranks on a Ray cluster (``Session(cluster="ray")``): actors that stay up across runs and cells.

``SessionRayActors`` is ``base.WarmRanks`` on a cluster, as ``backends.session.SessionProcesses`` is locally,
so ``Session`` and its rules — a run supervised until every rank is idle, interrupted ranks, a process group cut
and replaced, ranks recreated with "state lost" — apply unchanged. Underneath: one ``RayWorld`` for the session's
life, each rank's actor running ``RankActor.serve`` (the task loop of ``rank.session``), its relay carrying events
into the pipes the supervisors read. A command goes to a rank through its control thread; a run's function and its
large tensors go into Ray's object store once for every rank (``PortablePayload``). Ranks are interrupted by a
command (Ray runs them in a thread of the actor: no signal reaches them), and a process group is cut by each rank
closing the connections its own join made (its peers' pids are on other machines).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ...plan.plan import LaunchPlan
from ...wire.commands import BreakGroup, Command, RunFunction
from ...wire.events import RankStarted
from ...wire.payload import PortablePayload
from ..base import WarmRanks
from .backend import RayBackend, say
from .relay import RayRankProcess
from .world import RayWorld


class _RayCommandSender:
    """``CommandSender``'s surface for one Ray rank: ``send`` hands the command to the rank's control thread. A run's
    command with large data is put into the object store once, however many ranks it is sent to."""

    def __init__(self, actors: "SessionRayActors", rank: int) -> None:
        self.actors = actors
        self.rank = rank

    def send(self, command: Command, fds: Optional[List[int]] = None) -> None:
        relay = self.actors.world.relay if self.actors.world is not None else None
        if relay is None:
            raise OSError("the session's ranks are gone")
        if isinstance(command, BreakGroup):  # pids of other machines mean nothing there: cut what the join made
            command = BreakGroup(peer_pids=None, kernel_pid=0)
        relay.command(self.rank, self.actors.stored(command))

    def close(self) -> None:
        pass


class SessionRayActors(WarmRanks):
    """The ranks of ``Session(cluster="ray")``: see the module docstring.

    Example (what ``Session`` does)::

        actors = SessionRayActors(plan, group_backend="gloo", group_generation=0)
        handles = actors.start({})           # placed, up, serving; the supervisors watch the handles
        ...
        actors.kill()                        # actors killed, placement group removed
    """

    name = "session-ray"
    ranks_are_threads = True  # an actor runs the rank in a Ray thread: interrupted by a command

    def __init__(self, plan: LaunchPlan, group_backend: Optional[str], group_generation: int) -> None:
        self.plan = plan
        self.group_backend = group_backend
        self.group_generation = group_generation
        self.backend = RayBackend(plan)
        self.world: Optional[RayWorld] = None
        self.handles: List[RayRankProcess] = []
        self.commands: Dict[int, _RayCommandSender] = {}
        self.pids: Dict[int, int] = {}
        self._stored: Tuple[Any, Any] = (None, None)  # (command, its ObjectRef): the last run's, put once

    @classmethod
    def open_store(cls, plan: LaunchPlan) -> Any:
        """Connect, and refuse what the cluster cannot hold, before anything waits (rank 0 hosts the store)."""
        return RayBackend(plan).open_rendezvous()

    @classmethod
    def function_task(cls, function: Callable[..., Any], args: tuple, kwargs: Dict[str, Any],
                      return_all: bool) -> Tuple[RunFunction, List[int], Callable[[], None]]:
        payload = PortablePayload.create(function, args, kwargs, into_rank_namespace=True)
        command = RunFunction(task_id=0, data=payload.data, storages=payload.storages, buffers=payload.buffers,
                              shared_sizes=[], return_all=return_all, blobs=payload.blobs)
        return command, [], lambda: None

    def start(self, rendezvous_env: Dict[str, str]) -> List[RayRankProcess]:
        """Place the ranks, start their actors and their task loops (joining the group is the session's first
        task, which ``Session`` waits for)."""
        self.backend.open_rendezvous()
        world = RayWorld(self.backend.ray, self.plan)
        self.world = world
        never = lambda: False  # noqa: E731  (Session bounds the start by its own first task's timeout)
        if not world.place(never, lambda: None, say) or not world.start_actors(never, lambda: None):
            raise RuntimeError("the session's ranks could not be placed")
        self.handles = world.serve(self.group_backend, self.group_generation)
        self.commands = {rank.rank: _RayCommandSender(self, rank.rank) for rank in world.ranks}
        for handle in self.handles:  # what is typed at a rank's prompt goes with its commands, in order
            handle.answers = self.commands[handle.rank]
        self.pids = {rank.rank: rank.pid for rank in world.ranks}
        return list(self.handles)

    def stored(self, command: Command) -> Any:
        """What the rank's control thread is given for ``command``: the command itself, or for a run with large
        data the ObjectRef of the one copy in the object store."""
        if not (isinstance(command, RunFunction) and command.blobs):
            return command
        if self._stored[0] is not command:
            self._stored = (command, self.backend.ray.put(command))
        return self._stored[1]

    def started_event(self, rank: int) -> RankStarted:
        world = self.world
        node = world.ranks[rank].place.node if world is not None else None
        network = world.ranks[rank].network if world is not None else None
        return RankStarted(rank=rank, pid=self.pids[rank], host=node, reports_resources=True,
                           network=network.describe() if network is not None else None)

    def kill(self) -> None:
        """End every actor now, remove the placement group, close the kernel's ends."""
        if self.world is not None:
            self.world.kill()
            self.world = None
        for handle in self.handles:
            handle.process.join(5.0)
            handle.close_fds()
        self.handles = []
        self.close()

    def close(self) -> None:
        self._stored = (None, None)

