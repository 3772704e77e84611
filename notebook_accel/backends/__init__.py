"""Every way of running ranks, in one table: for each site a plan can name (``plan.sites``), the backend that runs a
launch there (a ``base.Backend``) and the one that keeps a ``Session``'s ranks warm there (a ``base.WarmRanks``).

| name          | applies to (the plan's site) | ranks are                                                  | sessions |
|---------------|------------------------------|------------------------------------------------------------|----------|
| ``inline``    | ``InKernel``                 | the kernel process itself (one rank, nothing started)      | no       |
| ``processes`` | ``LocalProcesses``           | local processes: fork, a warm forkserver, or spawn         | yes      |
| ``xla``       | ``XlaHost``                  | TPU cores: threads of ``xmp.spawn`` workers in a host      | yes      |
| ``nodes``     | ``SeveralNodes``             | this node's processes of a multi-node world, restarted as  | no       |
|               |                              | a whole after a failure (torch elastic rendezvous)         |          |
| ``ray``       | ``RayCluster``               | Ray actors on a cluster, in one placement group            | yes      |
| ``slurm``     | ``SlurmAllocation``          | the tasks of one Slurm job step (``srun``), in the         | yes      |
|               |                              | kernel's allocation or in one asked for                    |          |

Planning (``plan.plan``) decides the site; nothing else asks which backend applies. A new backend is a folder here
(kernel side), its site in ``plan.sites``, and one line in ``BACKENDS`` (see docs/architecture.md); ``register`` adds
a line at run time (a plug-in's, or the tests' own relayed backend: ``tests/relayed_local.py``), as
``plan.planners.register`` adds its planner.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Tuple, Type

from ..errors import LaunchConfigError
from ..plan.sites import InKernel, LocalProcesses, RayCluster, SeveralNodes, Site, SlurmAllocation, XlaHost
from .base import Backend, LaunchSink, WarmRanks

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.plan import LaunchPlan


@dataclass(frozen=True)
class BackendEntry:
    """One line of the table: ``site``, the plans it applies to; ``launch`` and ``session``, where the classes that
    run a launch there and keep a session's ranks warm there are, as (module, class) — imported when used, so a CPU
    launch never imports what a TPU or a cluster launch needs. ``session`` None: no sessions there."""

    site: Type[Site]
    launch: Tuple[str, str]
    session: Optional[Tuple[str, str]] = None

    @property
    def name(self) -> str:
        return self.site.name


BACKENDS: Dict[str, BackendEntry] = {entry.name: entry for entry in (
    BackendEntry(InKernel, (".inline", "InlineBackend")),
    BackendEntry(LocalProcesses, (".processes", "ProcessBackend"), (".session", "SessionProcesses")),
    BackendEntry(XlaHost, (".xla", "XlaBackend"), (".session", "SessionXlaHost")),
    BackendEntry(SeveralNodes, (".nodes", "NodesBackend")),
    BackendEntry(RayCluster, (".ray", "RayBackend"), (".ray.session", "SessionRayActors")),
    BackendEntry(SlurmAllocation, (".slurm", "SlurmBackend"), (".slurm.session", "SessionSlurmStep")),
)}


def register(entry: BackendEntry) -> BackendEntry:
    """Add (or replace) the line of ``entry.name``; returns it. The table's own lines are written above."""
    BACKENDS[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Take a line added with ``register`` out again (a test's, when it ends)."""
    BACKENDS.pop(name, None)


def entry_for(site: Site) -> BackendEntry:
    """The table's line for ``site`` (its exact type: an ``XlaHost`` is not run as ``LocalProcesses``)."""
    for entry in BACKENDS.values():
        if type(site) is entry.site:
            return entry
    raise LookupError(f"no backend runs ranks at {type(site).__name__}: add its line to backends.BACKENDS")


def _load(where: Tuple[str, str]) -> type:
    module, cls = where
    return getattr(importlib.import_module(module, __name__), cls)


def backend_class(name: str) -> Type[Backend]:
    """The ``Backend`` class of the table's line ``name``."""
    return _load(BACKENDS[name].launch)


def warm_ranks_class(name: str) -> Optional[Type[WarmRanks]]:
    """The ``WarmRanks`` class of the table's line ``name``; None where sessions are not kept."""
    where = BACKENDS[name].session
    return None if where is None else _load(where)


def backend_for(plan: "LaunchPlan") -> Backend:
    """The backend that runs ``plan`` (the table's line for its site)."""
    return _load(entry_for(plan.site).launch)(plan)


def warm_ranks_for(plan: "LaunchPlan") -> Type[WarmRanks]:
    """The class that keeps a session's ranks warm where ``plan`` runs them, or a clear ``LaunchConfigError``."""
    entry = entry_for(plan.site)
    if entry.session is None:
        raise LaunchConfigError(f"device={plan.device!r}: a Session cannot keep {entry.name} ranks warm; use "
                                f"notebook_launcher")
    return _load(entry.session)


__all__ = ["BACKENDS", "Backend", "BackendEntry", "LaunchSink", "WarmRanks", "backend_class", "backend_for",
           "entry_for", "register", "unregister", "warm_ranks_class", "warm_ranks_for"]
