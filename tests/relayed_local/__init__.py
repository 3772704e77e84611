"""The tests' own backend, defined only here: local processes driven through the relayed base
(``notebook_accel.backends.relay``) as a cluster's ranks would be.

It is the proof that a new way of running ranks needs no edit to the package (docs/architecture.md, "Adding a
backend"): everything a backend is made of is here, and ``registered()`` adds it to the package's two tables while a
test runs —

1. its site (``LocalRelayed``, a ``plan.sites.Site``) and its planner (``LocalRelayedPlanner``, a row of
   ``plan.planners``: ``cluster="relayed-local"``);
2. its folder: this package, kernel side (``RelayedLocalBackend``, the launch's ``relay.RelayedBackend``;
   ``RelayedLocalRanks``, a ``Session``'s, ``relay.RelayedWarmRanks``), and its launcher (``launcher.py``, as ``srun``
   is Slurm's: one task per rank, ``rank.slurm_task``'s conversation);
3. its line in ``backends.BACKENDS``.

What it fills in of the relayed base is what differs between clusters: how a world starts for an attempt (the
launcher, relayed by ``relay.StreamRelay``), a rank's node (the launcher's one node), how a death is told (the
launcher's words on its stderr) and the command transport (the launcher's stdin).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, List, Mapping, Optional

from notebook_accel.backends import BackendEntry, register, unregister
from notebook_accel.backends.base import LaunchSink, StopPolicy
from notebook_accel.backends.relay import RelayedBackend, RelayedWarmRanks, StreamRelay, task_setup
from notebook_accel.backends.supervisor import RankProcess
from notebook_accel.errors import LaunchConfigError
from notebook_accel.plan import planners
from notebook_accel.plan.planner import Devices, Placed, Planner
from notebook_accel.plan.sites import Site

from .launcher import NAME, NODE

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
_ENDED = re.compile(rf"^{NAME}: rank (?P<rank>\d+) ended with (?P<how>.*)$")


@dataclass(frozen=True)
class LocalRelayed(Site):
    """Every rank a task of the launcher, on this machine; ``max_restarts`` whole-world restarts."""

    name: ClassVar[str] = NAME
    max_restarts: int = 0


class LocalRelayedPlanner(Planner):
    """The planner row of ``cluster="relayed-local"``: CPU ranks, ``num_processes`` of them (2 by default)."""

    cluster = NAME
    refuses = ("master_addr", "use_port", "compile_cache", "num_nodes", "node_rank", "rdzv_backend", "rdzv_endpoint",
               "rdzv_id", "rdzv_conf")
    placed_by = "its launcher starts the ranks and they meet at rank 0's store"
    rank_is = "a task its launcher starts"

    def devices(self, options: Mapping[str, Any]) -> Devices:
        if options["device"] not in (None, "cpu"):
            raise LaunchConfigError(f"device={options['device']!r} is not supported with cluster={NAME!r} (cpu)")
        return Devices("cpu", None)

    def place(self, options: Mapping[str, Any], devices: Devices, allow_inline: bool) -> Placed:
        return Placed(LocalRelayed(max_restarts=int(options["max_restarts"])), int(options["num_processes"] or 2))


class LauncherRelay(StreamRelay):
    """The launcher's stdio, relayed; its stderr says which task ended, and how."""

    def _launcher_said(self, line: str) -> None:
        ended = _ENDED.match(line)
        if ended:
            self.task_ended(int(ended.group("rank")), ended.group("how"))
        else:
            super()._launcher_said(line)


class RelayedLocalBackend(RelayedBackend):
    """A launch's ranks as the launcher's tasks (see the module docstring)."""

    name = NAME
    world: Optional[LauncherRelay] = None

    def _start_world(self, attempt: int, sink: LaunchSink, policy: StopPolicy) -> Optional[List[RankProcess]]:
        return self.start_tasks(lambda: policy.reason() is not None, sink.tick, attempt=attempt)

    def start_tasks(self, stopped: Callable[[], bool], tick: Callable[[], None],
                    **setup: Any) -> Optional[List[RankProcess]]:
        """The launcher's tasks, running the launch (or with ``serve=True``, a session's task loops); None: stopped
        before every task said hello."""
        size = self.plan.world_size
        relay = self.world = LauncherRelay([sys.executable, "-u", LAUNCHER, str(size)], size)
        if not relay.wait_ready(stopped, tick):
            return None
        handles = relay.attach()
        relay.send(("run", task_setup(self.plan, relay, size, **setup)))
        return list(handles)

    def node_of(self, rank: int) -> str:
        return NODE

    def death_of(self, rank: int) -> Optional[str]:
        ended = self.world.ended.get(rank) if self.world is not None else None
        return ended or "it ended without a result"


class RelayedLocalRanks(RelayedWarmRanks):
    """A ``Session``'s ranks as the launcher's tasks, each serving the session's tasks."""

    name = f"session-{NAME}"
    backend_class = RelayedLocalBackend
    backend: RelayedLocalBackend

    def _start_world(self) -> List[RankProcess]:
        handles = self.backend.start_tasks(lambda: False, lambda: None, serve=True, group_backend=self.group_backend,
                                           group_generation=self.group_generation)
        assert handles is not None   # never stopped: ``Session`` bounds the start by its first task's timeout
        return handles

    def node_of(self, rank: int) -> Optional[str]:
        return NODE


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The backend's planner row and ``BACKENDS`` line, while the block runs."""
    planners.register(LocalRelayedPlanner())
    register(BackendEntry(LocalRelayed, (__name__, "RelayedLocalBackend"), (__name__, "RelayedLocalRanks")))
    try:
        yield
    finally:
        unregister(NAME)
        planners.unregister(NAME)
