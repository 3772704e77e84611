"""Every way of placing ranks, in one table: for each value of the ``cluster`` option (None: this machine), the
``Planner`` that turns a launch's options into its device, its world size and its site (``plan.sites``).

| ``cluster`` | planner          | refuses (beyond its rows' own checks)                  | device from               | site                |
|-------------|------------------|--------------------------------------------------------|---------------------------|---------------------|
| None        | ``LocalPlanner`` | the clusters' options; a session's ``num_nodes``       | this machine (best here)  | InKernel, Local-    |
|             |                  |                                                        |                           | Processes, XlaHost, |
|             |                  |                                                        |                           | SeveralNodes        |
| ``"ray"``   | ``RayPlanner``   | the store's address, compile cache, torch elastic's    | ``resources_per_rank``    | ``RayCluster``      |
|             |                  | node options, a start method; a session's num_nodes    |                           |                     |
| ``"slurm"`` | ``SlurmPlanner`` | the same, less ``num_nodes`` (the job's nodes)          | the job's GPUs            | ``SlurmAllocation`` |

``plan.plan.make_plan`` runs what every launch shares once (the call, the sharding variables, precision and sharding
against the device), asks the row of ``options.cluster`` for the device once and for the site, and makes the one
``LaunchPlan``. A new way of placing ranks is one ``Planner`` here (``register`` adds one at run time, as the tests'
own backend does), its site in ``plan.sites`` and its line in ``backends.BACKENDS`` (docs/architecture.md).

>>> sorted(name or "local" for name in PLANNERS)
['local', 'ray', 'slurm']
>>> from .options import defaults
>>> PLANNERS["ray"].devices({**defaults(), "cluster": "ray", "resources_per_rank": {"GPU": 1}})
Devices(kind='cuda', per_node=None)
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import LaunchConfigError
from .cluster import RayPlanner
from .local import LocalPlanner
from .options import CLUSTER_NAMES
from .planner import Devices, Placed, Planner
from .slurm import SlurmPlanner

PLANNERS: Dict[Optional[str], Planner] = {}


def register(planner: Planner) -> Planner:
    """Add (or replace) the row of ``planner.cluster``; returns it. The package's rows are registered below; a test
    (or a plug-in) adds its own the same way."""
    PLANNERS[planner.cluster] = planner
    if planner.cluster is not None:
        CLUSTER_NAMES.add(planner.cluster)
    return planner


def unregister(cluster: str) -> None:
    """Take a row added with ``register`` out again (a test's, when it ends)."""
    PLANNERS.pop(cluster, None)
    CLUSTER_NAMES.discard(cluster)


def planner_for(cluster: Optional[str]) -> Planner:
    """The row of ``cluster`` (None: this machine), or a clear error naming the ones there are."""
    try:
        return PLANNERS[cluster]
    except KeyError:
        known = ", ".join(repr(name) for name in PLANNERS if name is not None)
        raise LaunchConfigError(f"cluster={cluster!r} is not one of {known}") from None


def cluster_names() -> Tuple[str, ...]:
    """The values the ``cluster`` option takes: the table's rows (the ``cluster`` option checks against them)."""
    return tuple(name for name in PLANNERS if name is not None)


def checked_planner(options: Mapping[str, Any]) -> Planner:
    """The row of ``options["cluster"]`` (every launch setting, resolved), once it refused what does not apply there
    and the options only another row takes (``Planner.own``: given without that row's ``cluster``)."""
    planner = planner_for(options["cluster"])
    planner.check(options)
    for other in PLANNERS.values():
        if other is planner:
            continue
        for name in other.own:
            if options[name] is not None:
                raise LaunchConfigError(f"{name}={_shown(options[name])!r} {other.own_means}: give "
                                        f"cluster={other.cluster!r} too")
    return planner


def _shown(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


def check_session_options(options: Mapping[str, Any]) -> None:
    """What a ``Session`` may take where its options place the ranks: the planner's to say."""
    planner_for(options["cluster"]).check_session(options)


for _row in (LocalPlanner(), RayPlanner(), SlurmPlanner()):
    register(_row)

__all__ = ["Devices", "PLANNERS", "Placed", "Planner", "check_session_options", "checked_planner", "cluster_names",
           "planner_for", "register", "unregister"]
