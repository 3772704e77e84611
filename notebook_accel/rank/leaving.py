"""A rank whose function succeeded waits for its peers to finish too, before it closes its connections to them.

gloo connects every pair of ranks inside ``init_process_group``: a connection is made by one rank's background
thread, and that rank's main thread learns of it a moment later. If the peer at the other end ends in that moment
(a function that returns right after making the group, with no collective after it: ``return
PartialState().process_index``), its exit closes the connection, and the slower rank's ``init_process_group``
fails with gloo's "Connection closed by peer" although no rank did anything wrong. On a busy 2-core machine one
such 2-rank launch in four failed that way; a torchrun rank has the same race, and our suite met it once a run.

So before its exit handlers (which may destroy the group) and its exit, a rank that holds the default process group
says it is done on the group's own store and waits until every rank of the world has said so: the last collective
anyone would write, made of store keys instead (a ``barrier`` could pair with a peer's collective still running).
A rank that failed does not wait (the kernel stops its peers), and one that destroyed its group has none to wait
on. The wait is in one-second slices, so that a stop's signal is handled between them, and ends at the store's
own timeout (the group's, 30 minutes by default) with the rank leaving as it used to.
"""
from __future__ import annotations

import sys
import time
from datetime import timedelta

__all__ = ["wait_for_peers_to_finish"]

_DONE_KEY = "notebook_accel/rank_done/{rank}"  # under the group's store prefix: one attempt's keys, not another's
_SLICE = timedelta(seconds=1)


def wait_for_peers_to_finish() -> None:
    """Say on the default group's store that this rank is done; return once every rank has said it (or at the
    store's timeout). Nothing to do without ``torch.distributed`` loaded or without a default group.

    Example (a rank's end, after its result went to the kernel)::

        if run.exit_code == 0:
            wait_for_peers_to_finish()
        end_like_python(rank)
    """
    dist = sys.modules.get("torch.distributed")  # a function that never imported torch has no group to wait on
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
        rank, world = dist.get_rank(), dist.get_world_size()
        store.set(_DONE_KEY.format(rank=rank), "1")
        keys = [_DONE_KEY.format(rank=peer) for peer in range(world)]
        deadline = time.monotonic() + store.timeout.total_seconds()
    except Exception:  # a group made some other way (no store of torch's): leave as before
        return
    while time.monotonic() < deadline:
        try:
            store.wait(keys, _SLICE)
            return
        except Exception:  # this slice timed out (DistStoreError), or the store is gone: the kernel ended the launch
            if not _store_alive(store):
                return


def _store_alive(store: object) -> bool:
    try:
        store.num_keys()  # type: ignore[attr-defined]  # a round trip to the store's server
        return True
    except Exception:
        return False
