"""Which address and interface a rank offers its peers, decided from its node's routable address.

gloo (and TensorPipe RPC) pick the address a rank offers its peers by resolving the machine's host name, unless
``GLOO_SOCKET_IFNAME`` (``TP_SOCKET_IFNAME``) names an interface. Where the host name resolves to loopback (Debian's
default ``127.0.1.1 hostname`` line, many containers), every rank then offers ``127.0.0.1`` and a launch across hosts
fails with ``Gloo connectFullMesh failed ... remote=[127.0.0.1]``. So on every backend that spans hosts each rank gets
the interface that carries its node's routable address — the address Ray reports for the node, or the local address
this node uses to reach ``MASTER_ADDR`` (``route_address``) — unless the user set the variable. The host name is never
asked. ``NCCL_SOCKET_IFNAME`` is left to the user: NCCL picks its own interface well.

Example::

    network = rank_network(route_address("10.77.0.1"))   # on the node at 10.77.0.2
    network.env        # {"GLOO_SOCKET_IFNAME": "eth1", "TP_SOCKET_IFNAME": "eth1"}
    network.describe() # "eth1 10.77.0.2"
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

# The variables set to the interface, unless the user set them (gloo's, TensorPipe RPC's).
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
# A process rank's start-up info (``RankStarted.network``), set by a launcher that chose its interface.
NETWORK_VARIABLE = "NOTEBOOK_ACCEL_NETWORK"
_PROBE_PORT = 9   # the discard port: a UDP connect() sends nothing, it only asks the kernel for a route


@dataclass(frozen=True)
class RankNetwork:
    """A rank's node address, the interface that carries it (None: none found), and the variables the launcher
    sets for it (``env``: only those the user did not set)."""

    address: str
    interface: Optional[str]
    env: Dict[str, str] = field(default_factory=dict)
    user_set: Dict[str, str] = field(default_factory=dict)   # the user's own values, which win

    def describe(self) -> str:
        """For a rank's start-up info: ``"eth1 10.77.0.2"``, with the user's own setting if there is one."""
        if "GLOO_SOCKET_IFNAME" in self.user_set:
            return f"{self.user_set['GLOO_SOCKET_IFNAME']} {self.address} (GLOO_SOCKET_IFNAME set by the user)"
        if self.interface is None:
            return f"{self.address} (no interface of this node has it: gloo takes the host name's address)"
        return f"{self.interface} {self.address}"


def route_address(host: str) -> str:
    """This machine's address on the route to ``host`` (an IP or a name): the source address the kernel picks for it
    (a UDP ``connect`` sends no packet). ``host`` on this machine gives ``host``'s own address."""
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, _PROBE_PORT))
        return probe.getsockname()[0]


def interface_of(address: str) -> Optional[str]:
    """The name of this machine's interface that has ``address`` (None where none has it)."""
    import psutil

    wanted = _normal(address)
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family in (socket.AF_INET, socket.AF_INET6) and _normal(entry.address) == wanted:
                return name
    return None


def rank_network(address: str, environ: Optional[Mapping[str, str]] = None) -> RankNetwork:
    """The network of a rank whose node is reachable at ``address`` (an address of this machine): its interface, and
    ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME`` set to it where ``environ`` (default ``os.environ``) has neither."""
    environ = os.environ if environ is None else environ
    interface = interface_of(address)
    user_set = {name: environ[name] for name in IFNAME_VARIABLES if environ.get(name)}
    env = {name: interface for name in IFNAME_VARIABLES if interface and name not in user_set}
    return RankNetwork(address=address, interface=interface, env=env, user_set=user_set)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).version == 6
    except ValueError:
        return False


def _normal(address: str) -> str:
    """``address`` without an IPv6 zone (``fe80::1%eth0``), in its canonical form."""
    bare = address.split("%")[0]
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare
