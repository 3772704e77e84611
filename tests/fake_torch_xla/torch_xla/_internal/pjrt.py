"""Fake ``torch_xla._internal.pjrt``: the structure of the real ``spawn`` / ``run_multiprocess``."""
import concurrent.futures
import functools
import itertools
import os

import torch
import torch.multiprocessing

from .. import _fake_runtime, runtime
from . import collectives


class _SpawnFn:
    def __init__(self, fn, *args, **kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self) -> None:
        self.fn(runtime.global_ordinal(), *self.args, **self.kwargs)


def _run_thread_per_device(local_rank, local_world_size, fn, initializer_fn):
    initializer_fn(local_rank, local_world_size)
    indices = list(range(_fake_runtime.devices_per_process()))

    def _thread_fn(index):
        _fake_runtime.set_thread_device(index)
        return fn()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(indices)) as executor:
        ordinals = [_fake_runtime.ordinal_of(index) for index in indices]
        results = list(zip(ordinals, executor.map(_thread_fn, indices)))
    return dict(results)


def initialize_multiprocess(local_rank: int, local_world_size: int) -> None:
    os.environ.setdefault("PJRT_LOCAL_PROCESS_RANK", str(local_rank))
    os.environ.setdefault("PJRT_LOCAL_PROCESS_COUNT", str(local_world_size))
    _fake_runtime.replicated = True
    _fake_runtime.initialize()
    # The real PJRT client joins the host's coordination service and waits for every local process, so a
    # pool worker never gets a second task; the fake waits the same way.
    collectives.wait_for_processes(local_world_size)


def run_multiprocess(fn, *args, start_method: str = "spawn", **kwargs):
    if _fake_runtime.initialized:
        raise RuntimeError("Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.")
    num_processes = _fake_runtime.num_local_processes()
    with collectives.hosted_store():  # what PJRT's coordination service is to the real workers
        with concurrent.futures.ProcessPoolExecutor(
                max_workers=num_processes,
                mp_context=torch.multiprocessing.get_context(start_method)) as executor:
            mp_fn = functools.partial(_run_thread_per_device, local_world_size=num_processes,
                                      fn=functools.partial(fn, *args, **kwargs),
                                      initializer_fn=initialize_multiprocess)
            process_results = executor.map(mp_fn, range(num_processes))
            replica_results = list(itertools.chain.from_iterable(result.items() for result in process_results))
    return dict(replica_results)


def spawn(fn, nprocs=None, start_method="spawn", args=()):
    spawn_fn = _SpawnFn(fn, *args)
    if nprocs == 1:
        os.environ.setdefault("PJRT_LOCAL_PROCESS_COUNT", "1")
        _fake_runtime.initialize()
        return spawn_fn()
    elif nprocs is not None:
        raise ValueError(
            "Unsupported nprocs (%d). Please use nprocs=1 or None (default). If None, spawn will use all "
            "available devices. Use the environment variable X_NUM_DEVICES (where X is CPU, TPU, NEURONCORE, "
            "etc) to limit the number of devices used." % nprocs)
    run_multiprocess(spawn_fn, start_method=start_method)
