"""A warm session's relayed ranks: ``RelayedWarmRanks``, ``base.WarmRanks`` where the ranks run on other machines.

``Session`` and its rules (``backends.session``) apply unchanged: each rank serves the session's tasks
(``RankActor.serve``), its relay carries its events into the pipes the supervisors read, and a command goes to it
through the relay's transport. What every relayed session shares is here: the store is rank 0's (the backend's
``open_rendezvous`` checks what cannot run, in the caller's cell), a run's function travels portably
(``PortablePayload``: no fds, nothing to release), ranks are interrupted by a command (they run in a thread of their
actor or task: no signal reaches them), a process group is cut by each rank closing the connections its own join made
(``BreakGroup`` without pids: its peers' are on other machines), and a start that fails part-way ends what it
started before it is raised.

A subclass says ``backend_class`` and fills in ``_start_world`` (the ranks up and serving: their handles, the
backend's ``world`` set) and ``node_of``; where its world is not the backend's or ends otherwise, ``_send`` (a command
to one rank, through its transport) and ``_end_world``; optionally ``network_of``.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type

from ...plan.plan import LaunchPlan
from ...wire.commands import BreakGroup, Command, RunFunction
from ...wire.events import RankStarted
from ...wire.payload import PortablePayload
from ..base import WarmRanks
from ..supervisor import RankProcess
from .backend import RelayedBackend
from .stream import StreamRelay


class RelayedCommandSender:
    """``CommandSender``'s surface for one relayed rank: ``send`` hands the command to its transport."""

    def __init__(self, ranks: "RelayedWarmRanks", rank: int) -> None:
        self.ranks = ranks
        self.rank = rank

    def send(self, command: Command, fds: Optional[List[int]] = None) -> None:
        if isinstance(command, BreakGroup):  # pids of other machines mean nothing there: cut what the join made
            command = BreakGroup(peer_pids=None, kernel_pid=0)
        if not self.ranks._send(self.rank, command):
            raise OSError("the session's ranks are gone")

    def close(self) -> None:
        pass


class RelayedWarmRanks(WarmRanks):
    """The ranks of a relayed ``Session`` (see the module docstring)."""

    ranks_are_threads = True  # a rank runs in a thread of its actor or task: interrupted by a command
    backend_class: ClassVar[Type[RelayedBackend]]

    def __init__(self, plan: LaunchPlan, group_backend: Optional[str], group_generation: int) -> None:
        self.plan = plan
        self.group_backend = group_backend
        self.group_generation = group_generation
        self.backend = self.backend_class(plan)
        self.handles: List[RankProcess] = []
        self.commands: Dict[int, RelayedCommandSender] = {}
        self.pids: Dict[int, int] = {}

    @classmethod
    def open_store(cls, plan: LaunchPlan) -> Any:
        """Refuse what cannot run before anything waits (rank 0 hosts the store)."""
        return cls.backend_class(plan).open_rendezvous()

    @classmethod
    def function_task(cls, function: Callable[..., Any], args: tuple, kwargs: Dict[str, Any],
                      return_all: bool) -> Tuple[RunFunction, List[int], Callable[[], None]]:
        payload = PortablePayload.create(function, args, kwargs, into_rank_namespace=True)
        command = RunFunction(task_id=0, data=payload.data, storages=payload.storages, buffers=payload.buffers,
                              shared_sizes=[], return_all=return_all, blobs=payload.blobs)
        return command, [], lambda: None

    def start(self, rendezvous_env: Dict[str, str]) -> List[RankProcess]:
        """Every rank up and serving (joining the group is the session's first task, which ``Session`` waits for);
        whatever ends the start early (Ctrl-C while a job pends, ranks that cannot be placed) ends what was started
        before it is raised."""
        try:
            self.handles = self._start_world()
        except BaseException:
            self.kill()
            raise
        self.commands = {handle.rank: RelayedCommandSender(self, handle.rank) for handle in self.handles}
        for handle in self.handles:  # what is typed at a rank's prompt goes with its commands, in order
            handle.answers = self.commands[handle.rank]
        self.pids = {handle.rank: handle.pid for handle in self.handles}
        return list(self.handles)

    @abstractmethod
    def _start_world(self) -> List[RankProcess]:
        """The ranks started, each serving tasks (``serve`` with ``group_backend``/``group_generation``); their
        handles, by rank."""

    def _send(self, rank: int, command: Command) -> bool:
        """``command`` to ``rank`` through the transport; False when the ranks are gone. By default through the
        backend's ``world``, whose ``command(rank, command)`` says whether it got there (``StreamRelay``'s)."""
        world = self.backend.world
        return world is not None and bool(world.command(rank, command))

    def send_to_every_rank(self, command: Command, fds: Optional[List[int]] = None) -> None:
        """Where the transport is a launcher's stdin (``StreamRelay``: every task reads it), the command once, in one
        write, for every rank: sent once per rank, a Slurm node's copy of the second would wait for the first's
        delayed ACK, 40 ms (``wire.text_frames``). Elsewhere once per rank."""
        world = self.backend.world
        if isinstance(world, StreamRelay) and not isinstance(command, BreakGroup):
            world.send(command)   # EVERY_RANK: what is gone, if anything, is the supervisors' to report
            return
        super().send_to_every_rank(command, fds)

    def _end_world(self) -> None:
        """End every rank now and give back what the start asked of the cluster (idempotent). By default the
        backend's ``world`` is ended."""
        self.backend._end_world()

    @abstractmethod
    def node_of(self, rank: int) -> Optional[str]:
        """The node ``rank`` runs on (None once the ranks are gone)."""

    def network_of(self, rank: int) -> Optional[str]:
        """How the rank's node meets its peers (``rank.network.RankNetwork.describe()``), where the relay knows."""
        return None

    def started_event(self, rank: int) -> RankStarted:
        return RankStarted(rank=rank, pid=self.pids[rank], host=self.node_of(rank), reports_resources=True,
                           network=self.network_of(rank))

    def kill(self) -> None:
        """End every rank now, give back what was asked of the cluster, close the kernel's ends."""
        self._end_world()
        for handle in self.handles:
            handle.process.join(5.0)
            handle.close_fds()
        self.handles = []
        self.close()

    def close(self) -> None:
        """Release what the runs kept (nothing, unless a subclass keeps something)."""
