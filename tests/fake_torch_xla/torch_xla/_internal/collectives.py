"""The fake's blocking collectives: one gloo process group per device thread, over a store the spawning
process hosts. A peer that never arrives blocks the others (for an hour), as XLA collectives do."""
import contextlib
import datetime
import os
import pickle
import threading

import torch
import torch.distributed as dist

from .. import _fake_runtime

_STORE_PORT = "FAKE_TORCH_XLA_STORE_PORT"
_thread = threading.local()
_HANG = datetime.timedelta(hours=1)


@contextlib.contextmanager
def hosted_store():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_HANG)
    os.environ[_STORE_PORT] = str(store.port)
    try:
        yield store
    finally:
        os.environ.pop(_STORE_PORT, None)
        del store


def wait_for_processes(count: int) -> None:
    import time

    store = dist.TCPStore("127.0.0.1", int(os.environ[_STORE_PORT]), is_master=False, timeout=_HANG)
    store.add("processes_started", 1)
    while store.add("processes_started", 0) < count:
        time.sleep(0.01)


def group():
    """This device thread's process group (None when the world is one device)."""
    _fake_runtime.compiled = True
    if _fake_runtime.world_size() == 1:
        return None
    existing = getattr(_thread, "group", None)
    if existing is None:
        client = dist.TCPStore("127.0.0.1", int(os.environ[_STORE_PORT]), is_master=False, timeout=_HANG)
        store = dist.PrefixStore("fake_torch_xla", client)
        existing = _thread.group = (dist.ProcessGroupGloo(store, _fake_runtime.global_ordinal(),
                                                          _fake_runtime.world_size(), _HANG), store)
    return existing


_OPS = {"sum": dist.ReduceOp.SUM, "mul": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX, "and": dist.ReduceOp.BAND, "or": dist.ReduceOp.BOR}


def all_reduce_(tensor: torch.Tensor, reduce_type: str) -> None:
    pair = group()
    if pair is not None:
        pair[0].allreduce([tensor], _options(reduce_type)).wait()


def _options(reduce_type: str):
    options = dist.AllreduceOptions()
    options.reduceOp = _OPS[reduce_type]
    return options


def all_gather(tensor: torch.Tensor):
    pair = group()
    if pair is None:
        return [tensor.clone()]
    outputs = [torch.empty_like(tensor) for _ in range(_fake_runtime.world_size())]
    pair[0].allgather([outputs], [tensor.contiguous()]).wait()
    return outputs


def exchange(tag: str, data) -> list:
    """Every replica's ``data``, by ordinal (mesh_reduce, rendezvous): a blocking exchange on the store."""
    pair = group()
    if pair is None:
        return [data]
    count = getattr(_thread, "exchanges", 0)
    _thread.exchanges = count + 1
    store = pair[1]
    key = f"exchange/{count}/{tag}"
    store.set(f"{key}/{_fake_runtime.global_ordinal()}", pickle.dumps(data))
    keys = [f"{key}/{ordinal}" for ordinal in range(_fake_runtime.world_size())]
    store.wait(keys)
    return [pickle.loads(store.get(name)) for name in keys]
