"""Options of a launch over several nodes, or with restarts, checked before any process starts.

The nodes backend (``backends/nodes.py``) runs them: torch elastic's rendezvous handlers say who is in
the world; every node runs its own ranks under our supervisor; a failure stops every node, and the whole
world runs again while restarts are left.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..errors import LaunchConfigError, LaunchConfigTypeError
from .options import NODE_OPTION_NAMES, OPTIONS

DEFAULT_RDZV_ID = "none"             # torchrun's default run id
DEFAULT_JOIN_TIMEOUT = 600.0         # seconds, torch elastic's default join timeout
JOIN_TIMEOUT_KEYS = ("join_timeout", "timeout")  # c10d's name, static's name
DEFAULT_NODE_TIMEOUT = 30.0          # seconds without a beat from a node's launcher before it counts as lost
OUR_RDZV_KEYS = ("node_timeout", "local_addr")  # rdzv_conf keys read by us, not passed to torch's handler


@dataclass
class NodeOptions:
    """Who this node is in a multi-node launch, how nodes find each other, and how often to restart."""

    num_nodes: int
    node_rank: Optional[int]  # None: arrival order (c10d, etcd), 0 (static)
    rdzv_backend: str
    rdzv_endpoint: Optional[str]
    rdzv_id: str
    rdzv_conf: Dict[str, Any]
    max_restarts: int
    monitor_interval: float

    @property
    def join_timeout(self) -> float:
        """Seconds to wait for every node to join (``rdzv_conf={"join_timeout": 60}``)."""
        for key in JOIN_TIMEOUT_KEYS:
            if key in self.rdzv_conf:
                return float(self.rdzv_conf[key])
        return DEFAULT_JOIN_TIMEOUT

    @property
    def node_timeout(self) -> float:
        """Seconds of silence after which a node's launcher counts as gone (``rdzv_conf={"node_timeout": 30}``)."""
        return float(self.rdzv_conf.get("node_timeout", DEFAULT_NODE_TIMEOUT))


def check_node_options(**given: Any) -> Optional[NodeOptions]:
    """``NodeOptions`` for a multi-node or restarting launch, ``None`` for a plain one; clear errors. Options
    not given take ``plan.options``' defaults.

    >>> check_node_options(num_nodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500").node_rank
    1
    >>> check_node_options() is None
    True
    """
    unknown = sorted(set(given) - set(NODE_OPTION_NAMES))
    if unknown:
        raise LaunchConfigTypeError(f"unexpected launcher option(s): {', '.join(unknown)}")
    values = {name: OPTIONS[name].default for name in NODE_OPTION_NAMES}
    values.update(given)
    num_nodes, node_rank, rdzv_backend = values["num_nodes"], values["node_rank"], values["rdzv_backend"]
    rdzv_endpoint, rdzv_id, rdzv_conf = values["rdzv_endpoint"], values["rdzv_id"], values["rdzv_conf"]
    max_restarts, monitor_interval = values["max_restarts"], values["monitor_interval"]
    if not _is_int(num_nodes) or num_nodes < 1:
        raise LaunchConfigError(f"num_nodes must be a positive int, got {num_nodes!r}")
    if node_rank is not None and (not _is_int(node_rank) or not 0 <= node_rank < num_nodes):
        raise LaunchConfigError(f"node_rank must be None or an int in 0..{num_nodes - 1} (num_nodes={num_nodes}), "
                                f"got {node_rank!r}")
    if not _is_int(max_restarts) or max_restarts < 0:
        raise LaunchConfigError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    if (isinstance(monitor_interval, bool) or not isinstance(monitor_interval, numbers.Real)
            or not monitor_interval > 0):
        raise LaunchConfigError(f"monitor_interval must be a positive number of seconds, got {monitor_interval!r}")
    if rdzv_conf is None:
        rdzv_conf = {}
    if not isinstance(rdzv_conf, dict) or not all(isinstance(key, str) for key in rdzv_conf):
        raise LaunchConfigError(f"rdzv_conf must be a dict of str keys or None, got {rdzv_conf!r}")
    for key in JOIN_TIMEOUT_KEYS + ("node_timeout",):
        if key in rdzv_conf and not _positive_number(rdzv_conf[key]):
            raise LaunchConfigError(f"rdzv_conf[{key!r}] must be a positive number of seconds, "
                                    f"got {rdzv_conf[key]!r}")
    if rdzv_id is not None and (not isinstance(rdzv_id, str) or not rdzv_id):
        raise LaunchConfigError(f"rdzv_id must be a non-empty string or None, got {rdzv_id!r}")
    if not isinstance(rdzv_backend, str) or not rdzv_backend:
        raise LaunchConfigError(f"rdzv_backend must be a rendezvous backend name, got {rdzv_backend!r}")
    if num_nodes == 1 and max_restarts == 0:
        return None
    if num_nodes > 1:
        _check_backend(rdzv_backend)
        _check_endpoint(rdzv_backend, rdzv_endpoint)
    return NodeOptions(num_nodes=int(num_nodes), node_rank=None if node_rank is None else int(node_rank),
                       rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id or DEFAULT_RDZV_ID,
                       rdzv_conf=dict(rdzv_conf), max_restarts=int(max_restarts),
                       monitor_interval=float(monitor_interval))


def registered_backends() -> list:
    """Names torch elastic's handler registry knows (static, c10d, etcd, etcd-v2 and plugins)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry  # built-ins registered on import

    return sorted(getattr(rendezvous_handler_registry, "_registry", {}))


def _check_backend(name: str) -> None:
    known = registered_backends()
    if known and name not in known:
        raise LaunchConfigError(f"rdzv_backend={name!r} is not a registered torch rendezvous backend "
                                f"(registered: {', '.join(known)})")


def _check_endpoint(backend: str, endpoint: Any) -> None:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise LaunchConfigError(
            "num_nodes > 1 needs rdzv_endpoint='host:port': node 0's address for rdzv_backend='static', "
            "the rendezvous store's for 'c10d' (the same on every node)")
    host, sep, port = endpoint.strip().rpartition(":")
    if backend == "static" and (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536):
        raise LaunchConfigError(f"rdzv_endpoint={endpoint!r} must be 'host:port' with a port in 1..65535")
    if sep and port and not port.isdigit():
        raise LaunchConfigError(f"rdzv_endpoint={endpoint!r}: the port {port!r} is not a number")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _positive_number(value: Any) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False
