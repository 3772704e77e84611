"""Every way of starting ranks, behind one protocol (``base.Backend``); the plan names which one runs.

| name        | ranks are                                              | picked when                     |
|-------------|--------------------------------------------------------|---------------------------------|
| ``inline``  | the kernel process itself (one rank, nothing started)  | one rank, no start method asked |
| ``processes`` | local processes: fork, a warm forkserver, or spawn   | CPU, CUDA, MPS                  |
| ``xla``     | TPU cores: threads of ``xmp.spawn`` workers in a host  | device="xla"                    |
| ``nodes``   | this node's processes of a multi-node world, restarted | ``num_nodes > 1`` or             |
|             | as a whole after a failure (torch elastic rendezvous)  | ``max_restarts > 0``            |
| ``ray``     | Ray actors on a cluster, in one placement group        | ``cluster="ray"``               |
| ``slurm``   | the tasks of one Slurm job step (``srun``)             | ``cluster="slurm"``             |
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict, Tuple, Type

from .base import Backend, LaunchSink

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.plan import LaunchPlan

# name -> (module, class): imported when used, so a CPU launch never imports what a TPU launch needs.
BACKENDS: Dict[str, Tuple[str, str]] = {
    "inline": (".inline", "InlineBackend"),
    "processes": (".processes", "ProcessBackend"),
    "xla": (".xla", "XlaBackend"),
    "nodes": (".nodes", "NodesBackend"),
    "ray": (".ray", "RayBackend"),
    "slurm": (".slurm", "SlurmBackend"),
}


def backend_class(name: str) -> Type[Backend]:
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module, __name__), cls)


def backend_for(plan: "LaunchPlan") -> Backend:
    """The backend that runs ``plan`` (``plan.backend`` names it)."""
    return backend_class(plan.backend)(plan)


__all__ = ["BACKENDS", "Backend", "LaunchSink", "backend_class", "backend_for"]
