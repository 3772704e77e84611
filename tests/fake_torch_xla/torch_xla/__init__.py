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

- ``module.to(device)`` makes new ``Parameter`` objects holding new tensors, as moving a module to an XLA device
  does (a CPU and an XLA tensor cannot share a TensorImpl, so ``Module._apply`` cannot swap ``.data`` in place):
  an optimizer built on the old parameters trains nothing. A second ``.to(device)`` keeps them.

What is fake: a "device" is the CPU (``torch.device("cpu")``), compiling and ``sync()`` do nothing.
"""
import weakref

import torch

from . import _XLAC, _fake_runtime
from ._fake_runtime import current_device

_on_device = weakref.WeakSet()   # parameters .to(device) made: "XLA tensors", moved already
_plain_module_to = torch.nn.Module.to


def _module_to(module, *args, **kwargs):
    target = torch._C._nn._parse_to(*args, **kwargs)[0]
    moved = _plain_module_to(module, *args, **kwargs)
    parameters = list(moved.parameters())
    if target is None or target.type != "cpu" or not _fake_runtime.initialized or \
            all(parameter in _on_device for parameter in parameters):
        return moved  # not a move to the (fake) XLA device of a process using it, or there already
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)  # Module._apply: new Parameter objects
    try:
        moved._apply(lambda tensor: tensor.clone())  # new tensors, as a copy to another device makes
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)
    _on_device.update(moved.parameters())
    return moved


torch.nn.Module.to = _module_to

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
