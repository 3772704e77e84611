"""XLA's CPU client (``PJRT_DEVICE=CPU``): cut lazy graphs one device thread at a time, so TPU code runs there.

On the CPU client the devices of a worker are threads of one process, and XLA:CPU names the in-process
rendezvous of a collective after the HloModule's unique id (torch_xla's cross-replica collectives carry no
channel id). torch_xla compiles a graph, on a cache miss, in whichever thread cuts it first: two threads cutting
the same new graph at once compile it twice, get two module ids, wait in two rendezvous that never meet, and
XLA aborts the worker after its termination timeout (``SIGABRT``). A TPU has no such problem (one executable
runs on every core), so none of this is done there.

What is done here, once per worker process and on the CPU client only:

- every graph cut that goes through torch_xla's Python API is taken under one process-wide lock: the step
  marker (``torch_xla.sync``, ``xm.mark_step``, the one ``MpDeviceLoader`` takes per batch,
  ``optimizer_step(barrier=True)``) and ``_xla_sync_multi`` (``xm.unlazy``, ``xm.save``). The first thread
  compiles; the second finds the executable in torch_xla's cache. Compiling is what the lock serializes: the
  cut only dispatches the execution, which runs after the lock is released, so the threads still meet in the
  collective. A cut asked to ``wait`` waits for its own device outside the lock (waiting under it would keep
  the peer from dispatching the other half of a collective);
- each collective of ``xla_model`` (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
  ``collective_permute``; ``reduce_gradients``, ``optimizer_step`` and ``mesh_reduce`` call them) is followed by a serialized cut, so a collective's graph is
  never compiled by a ``.item()`` or ``.cpu()``, which cut in C++ where no lock can reach. This moves graph
  boundaries on the CPU client (a training step becomes two graphs), never results.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional

_CUT_LOCK = threading.RLock()  # re-entrant: a collective's cut may come from inside a wrapped call
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
_installed_in: Optional[int] = None


def on_cpu_client() -> bool:
    """torch_xla runs on its CPU client (``PJRT_DEVICE=CPU``, or chosen by default where there is no TPU)."""
    import torch_xla.runtime as xr

    return (xr.device_type() or "").upper() == "CPU"


def serialize_graph_cuts() -> bool:
    """On the CPU client, make every graph cut of this process one thread at a time (see the module docstring).
    Idempotent per process; returns whether the cuts are serialized. Does nothing on a TPU."""
    import os

    global _installed_in
    if _installed_in == os.getpid():
        return True
    if not on_cpu_client():
        return False
    import torch_xla
    import torch_xla.core.xla_model as xm

    xlac = torch_xla._XLAC
    xlac._xla_step_marker = _serialized_step_marker(xlac)
    xlac._xla_sync_multi = _serialized_sync_multi(xlac)
    for name in _COLLECTIVES:
        collective = getattr(xm, name, None)
        if collective is not None and not getattr(collective, "_notebook_accel_cut", False):
            setattr(xm, name, _cut_around(collective, torch_xla))
    _installed_in = os.getpid()
    return True


def _serialized_step_marker(xlac: Any):
    step_marker = xlac._xla_step_marker

    def serialized_step_marker(device: str, devices: List[str], wait: bool = True, reset_scope: bool = True):
        own = _real_devices(xlac, [device or xlac._xla_get_default_device()])
        # First, outside the lock, let this device's previous graph finish: a cut waits for its device's last
        # execution, which may sit in a collective waiting for a peer thread that needs the lock to dispatch
        # its half. Waiting under the lock was the Accelerator loop's abort (one thread a step ahead).
        xlac._xla_wait_device_ops(devices=own)
        with _CUT_LOCK:
            step_marker(device, devices, wait=False, reset_scope=reset_scope)
        xlac._xla_wait_device_ops(devices=own)
    return serialized_step_marker


def _serialized_sync_multi(xlac: Any):
    sync_multi = xlac._xla_sync_multi

    def serialized_sync_multi(tensors: List[Any], devices: List[str], wait: bool = True,
                              sync_xla_data: bool = True) -> None:
        own = _real_devices(xlac, list(devices) or [xlac._xla_get_default_device()])
        xlac._xla_wait_device_ops(devices=own)  # as above
        with _CUT_LOCK:
            sync_multi(tensors, devices=devices, wait=False, sync_xla_data=sync_xla_data)
        xlac._xla_wait_device_ops(devices=own)
    return serialized_sync_multi


def _real_devices(xlac: Any, devices: List[str]) -> List[str]:
    """``xla:0`` → ``CPU:0``: the names ``_xla_wait_device_ops`` knows (it fails on the ``xla:N`` ones)."""
    return list(xlac._xla_real_devices(devices))


def _cut_around(collective: Callable[..., Any], torch_xla: Any) -> Callable[..., Any]:
    @functools.wraps(collective)
    def collective_in_its_own_graph(*args: Any, **kwargs: Any) -> Any:
        torch_xla.sync()  # its inputs become device data: no rank-dependent constant in the collective's graph
        result = collective(*args, **kwargs)
        torch_xla.sync()  # compiled here, under the lock, never by a .item() in C++
        return result
    collective_in_its_own_graph._notebook_accel_cut = True  # type: ignore[attr-defined]
    return collective_in_its_own_graph
