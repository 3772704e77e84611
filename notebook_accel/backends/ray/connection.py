"""Reaching Ray from the kernel: imported only for ``cluster="ray"``, connected the way the user set it up.

The kernel's own ``ray.init(...)`` wins (a cluster address, ``ray://``, a runtime_env); without one, ``ray.init()``
is called here — it joins ``RAY_ADDRESS``'s cluster when that is set (Databricks' Ray on Spark, a job submitted to
a cluster), else starts a local Ray — and one line says which. Nothing else: the kernel hosts no port for the
ranks, and ``ray stop`` is never run (it would end every Ray process of the machine).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

from ...errors import LaunchConfigError

INSTALL_HINT = 'pip install "notebook_accel[ray]"'


def import_ray() -> Any:
    """The ``ray`` module, or a ``LaunchConfigError`` that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise LaunchConfigError(f"cluster='ray' needs Ray, which is not installed here ({err}): "
                                f"{INSTALL_HINT}") from None
    return ray


def connect() -> Any:
    """Ray, connected: the kernel's own connection, else ``ray.init()`` (``RAY_ADDRESS``, or a local Ray)."""
    ray = import_ray()
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        where = f"the cluster at RAY_ADDRESS={address}" if address else "a local Ray on this machine"
        print(f"notebook_accel: Ray was not initialized in this kernel; calling ray.init() ({where}). Call "
              f"ray.init(address=...) first to choose the cluster.", file=sys.stderr)
        ray.init()
    return ray


def alive_nodes(ray: Any) -> List[Dict[str, Any]]:
    """The cluster's live nodes, as ``ray.nodes()`` describes them (``NodeID``, ``NodeManagerAddress``,
    ``NodeManagerHostname``, ``Resources``)."""
    return [node for node in ray.nodes() if node.get("Alive")]


def node_labels(nodes: List[Dict[str, Any]]) -> Dict[str, str]:
    """A short name for each node (by node id): its host name, with the start of its node id where several nodes
    share a host (a fake multi-node cluster, containers on one machine)."""
    hosts = [node.get("NodeManagerHostname") or node.get("NodeManagerAddress", "?") for node in nodes]
    return {node["NodeID"]: host if hosts.count(host) == 1 else f"{host}:{node['NodeID'][:6]}"
            for node, host in zip(nodes, hosts)}
