"""A FAKE ``torch_xla`` for tests on machines without a TPU (this one has none). Not the real package.

It lives on disk (``tests/fake_torch_xla``, put on ``PYTHONPATH``) so that ranks started by fork, forkserver or
spawn import it too. It mirrors the torch_xla 2.9 behaviour notebook_accel relies on, checked against the real
2.9.0 sources (``torch_xla/_internal/pjrt.py``, ``_internal/tpu.py``, ``runtime.py``, ``core/xla_model.py``):

- ``xmp.spawn(fn, args, nprocs, start_method)``: ``nprocs=1`` runs ``fn(0, *args)`` in the calling process,
  ``None`` runs every device, anything else raises the same ``ValueError``; it returns None (results never
  come back); it raises "Runtime is already initialized..." when an XLA device was used in the caller first.
- processes × threads from the environment: on ``PJRT_DEVICE=TPU`` one worker process per TPU chip found on
  the PCI bus (vendor 0x1ae0; read under ``$NOTEBOOK_ACCEL_SYSFS_ROOT/sys/bus/pci/devices`` instead of
  ``/sys/...``) with 2 device threads per chip on v2/v3 (``TPU_ACCELERATOR_TYPE``), else 1; on
  ``PJRT_DEVICE=CPU`` one process with ``CPU_NUM_DEVICES`` threads. Workers come from a
  ``ProcessPoolExecutor`` with ``start_method``'s context, threads from a ``ThreadPoolExecutor``, exactly as
  in ``pjrt.run_multiprocess``; each worker gets ``PJRT_LOCAL_PROCESS_RANK`` / ``PJRT_LOCAL_PROCESS_COUNT``.
- ``fn`` gets the global ordinal (``local process rank * devices per process + device index``).
- the runtime counts as initialized once a device is used (``torch_xla.device()``, ``xm.xla_device()``...).
- blocking collectives (``xm.all_reduce``, ``all_gather``, ``reduce_gradients``, ``optimizer_step``,
  ``rendezvous``, ``mesh_reduce``): a peer that never arrives blocks the others, as XLA's do
  (pytorch/xla#7974). They run on gloo process groups, one per device thread.

What is fake: a "device" is the CPU (``torch.device("cpu")``), compiling and ``sync()`` do nothing.
"""
import torch

from . import _XLAC
from ._fake_runtime import current_device

__version__ = "2.9.0+fake"


def device(index=None) -> torch.device:
    return current_device()


def devices():
    from .core import xla_model as xm

    return [torch.device("cpu") for _ in xm.get_xla_supported_devices()]


def device_count() -> int:
    from . import runtime

    return runtime.addressable_device_count()


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Real torch_xla compiles and runs the pending graph here, through the step marker (so does the fake,
    which only records the cut: its tensors are already computed)."""
    _XLAC._xla_step_marker(_XLAC._xla_get_default_device(), [], wait=wait, reset_scope=reset_scope)


def launch(fn, args=(), start_method="spawn", debug_single_process=False):
    from .distributed import xla_multiprocessing as xmp

    return xmp.spawn(fn, args=args, nprocs=1 if debug_single_process else None, start_method=start_method)
