"""This node's place in a multi-node world, from torch elastic's rendezvous handler registry."""
from __future__ import annotations

import contextlib
import gc
import ipaddress
import os
import socket
import time
from typing import Optional

from ...errors import LaunchError
from ...plan.nodes import OUR_RDZV_KEYS, NodeOptions
from ...rank.network import interface_of, route_address

PREFIX = "notebook_accel"             # our keys in the store every node shares
CLOSING_KEY = f"{PREFIX}/closing"     # set in the shared store once every node left the launch
_CLOSED_RETRY_SECONDS = 0.5           # between joins while the previous launch's store is still up


class Membership:
    """This node's place in the world, from torch elastic's rendezvous handler registry."""

    def __init__(self, options: NodeOptions) -> None:
        self.options = options
        self.handler = None
        self.store = None
        self.group_rank = 0
        self.node0_addr = "127.0.0.1"
        self._closed = False

    def join(self) -> None:
        """Block until every node joined; a clear ``LaunchError`` after the join timeout."""
        options = self.options
        if options.num_nodes == 1:  # restarts on one machine: nothing to meet, a local store will do
            from torch.distributed import HashStore

            self.store = HashStore()
            return
        from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

        conf = {key: value for key, value in options.rdzv_conf.items() if key not in OUR_RDZV_KEYS}
        if options.rdzv_backend == "static":
            conf.setdefault("rank", options.node_rank or 0)  # static: the node's rank is its place
            conf.setdefault("timeout", int(options.join_timeout))
        # This node's address as the others reach it: the user's, else the one on our route to the endpoint (torch
        # would take the host name's, which may resolve to 127.0.0.1 and reach no other node).
        local_addr = options.rdzv_conf.get("local_addr") or endpoint_route(options.rdzv_endpoint)
        if options.rdzv_backend == "c10d" and "is_host" not in conf:
            is_host = hosts_c10d_store(options.rdzv_endpoint)
            if is_host is not None:
                conf["is_host"] = is_host
        params = RendezvousParameters(backend=options.rdzv_backend, endpoint=options.rdzv_endpoint or "",
                                      run_id=options.rdzv_id, min_nodes=options.num_nodes,
                                      max_nodes=options.num_nodes, local_addr=local_addr, **conf)
        try:
            info = self._next_rendezvous(rendezvous_handler_registry, params, options.join_timeout,
                                         chose_host="is_host" not in options.rdzv_conf)
        except Exception as err:
            raise LaunchError(
                f"{_this_node(options)}: the {options.num_nodes} nodes did not all join the "
                f"{options.rdzv_backend!r} rendezvous at {options.rdzv_endpoint} within "
                f"{options.join_timeout:g} s ({type(err).__name__}: {err}). Start the same launch on every "
                f"node with num_nodes={options.num_nodes}, the same rdzv_endpoint and rdzv_id, and a "
                f"distinct node_rank; rdzv_conf={{'join_timeout': seconds}} sets the wait.") from err
        self.store = info.store
        self.group_rank = info.rank
        bootstrap = getattr(info, "bootstrap_store_info", None)
        if local_addr and self.group_rank == 0:
            self.node0_addr = local_addr
        elif options.rdzv_backend == "static":  # node 0 is the endpoint's host by definition
            self.node0_addr = (options.rdzv_endpoint or "").rpartition(":")[0] or "127.0.0.1"
        elif bootstrap is not None:  # node 0's own address as torch elastic found it (torchrun's MASTER_ADDR)
            self.node0_addr = bootstrap.master_addr
        else:
            self.node0_addr = socket.getfqdn()

    def _next_rendezvous(self, registry, params, join_timeout: float, chose_host: bool = False):
        """``next_rendezvous()``, joining again until the join timeout when the rendezvous was found closed
        (the previous launch's with the same rdzv_id, whose store is about to be released) or its store
        could not be reached (not up yet, or just going away: with c10d any node may host it).
        ``chose_host``: ``is_host`` in ``params`` is our choice, not the user's; where hosting fails (another
        node's launch on this machine hosts the store already) this node joins as a client, as torch's own
        choice would."""
        from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousConnectionError

        deadline = time.monotonic() + join_timeout
        while True:
            try:
                self.handler, self._closed = self._create_handler(registry, params, chose_host), False
                with _no_shared_tcp_store():
                    info = self.handler.next_rendezvous()
                if not info.store.check([CLOSING_KEY]):
                    return info
                # A store the previous launch already left (its host releases it in a moment): not ours.
                raise RendezvousClosedError("the previous launch's store")
            except (RendezvousClosedError, RendezvousConnectionError):
                self._drop()  # never joined: nothing to shut down
                if time.monotonic() > deadline:
                    raise
                time.sleep(_CLOSED_RETRY_SECONDS)
            except BaseException:
                self._drop()
                raise

    @staticmethod
    def _create_handler(registry, params, chose_host: bool):
        from torch.distributed.elastic.rendezvous import RendezvousConnectionError

        try:
            return registry.create_handler(params)
        except RendezvousConnectionError:
            if not (chose_host and params.get_as_bool("is_host")):
                raise
            params.config["is_host"] = False
            return registry.create_handler(params)

    def shutdown(self) -> None:
        """Close the rendezvous and stop its heartbeats, while every node's store is still up (each node
        does this before saying goodbye, and the node hosting the store leaves last)."""
        if self.handler is not None and not self._closed:
            self._closed = True
            try:
                self.handler.shutdown()
            except Exception:  # the store's host is gone already: nothing left to close
                pass

    def release(self) -> None:
        """Close the rendezvous if still open, then drop the handler and the store."""
        self.shutdown()
        self._drop()

    def _drop(self) -> None:
        """Drop the handler and the store (the host's listener goes with its last reference)."""
        handler, self.handler, self.store = self.handler, None, None
        del handler
        # The c10d handler's objects refer to each other: only a collection frees its store's listener
        # now, so that the next launch with the same endpoint finds the port free.
        gc.collect()


def endpoint_route(endpoint: Optional[str]) -> Optional[str]:
    """This node's address on the route to the rendezvous endpoint's host (``rank.network.route_address``); None
    without an endpoint, or where no route leads there (torch then falls back to the host name's address)."""
    host = _endpoint_host(endpoint)
    if not host:
        return None
    try:
        return route_address(host)
    except OSError:
        return None


def hosts_c10d_store(endpoint: Optional[str]) -> Optional[bool]:
    """Whether this node hosts the c10d rendezvous store: the endpoint's host (an address, or a name resolved here)
    is an address of one of this node's interfaces. torch decides it by the host name, whose address may be
    127.0.0.1 on every node: then no node hosts it and all wait out their tries. None (torch's own rule) where the
    endpoint is loopback here (``localhost``, or this machine's own name on Debian's ``127.0.1.1`` line): every node
    on this machine matches, and torch lets the first that binds the port host it; and where the name does not
    resolve (torch's own error says so)."""
    host = _endpoint_host(endpoint)
    if not host:
        return None
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    if not addresses or any(_is_loopback(address) for address in addresses):
        return None
    return any(interface_of(address) is not None for address in addresses)


def _endpoint_host(endpoint: Optional[str]) -> str:
    """The host of ``host:port`` (``[v6]:port``) as torch parses it; "" without an endpoint."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if not (endpoint or "").strip():
        return ""
    try:
        return parse_rendezvous_endpoint(endpoint, default_port=29400)[0]
    except ValueError:
        return ""


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _this_node(options: NodeOptions) -> str:
    return "this node" if options.node_rank is None else f"node {options.node_rank}"


@contextlib.contextmanager
def _no_shared_tcp_store():
    """torch's c10d rendezvous would open one more unauthenticated listener on node 0 for the workers to
    share; ours use the fresh store of each attempt instead, so ask torch not to (its documented opt-out)."""
    variable = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    previous = os.environ.get(variable)
    os.environ[variable] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous
