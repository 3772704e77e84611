"""This node's place in a multi-node world, from torch elastic's rendezvous handler registry."""
from __future__ import annotations

import contextlib
import gc
import os
import socket
import time

from ...errors import LaunchError
from ...plan.nodes import OUR_RDZV_KEYS, NodeOptions

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
        local_addr = options.rdzv_conf.get("local_addr")  # this node's address as the others reach it
        params = RendezvousParameters(backend=options.rdzv_backend, endpoint=options.rdzv_endpoint or "",
                                      run_id=options.rdzv_id, min_nodes=options.num_nodes,
                                      max_nodes=options.num_nodes, local_addr=local_addr, **conf)
        try:
            info = self._next_rendezvous(rendezvous_handler_registry, params, options.join_timeout)
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

    def _next_rendezvous(self, registry, params, join_timeout: float):
        """``next_rendezvous()``, joining again until the join timeout when the rendezvous was found closed
        (the previous launch's with the same rdzv_id, whose store is about to be released) or its store
        could not be reached (not up yet, or just going away: with c10d any node may host it)."""
        from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousConnectionError

        deadline = time.monotonic() + join_timeout
        while True:
            try:
                self.handler, self._closed = registry.create_handler(params), False
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
