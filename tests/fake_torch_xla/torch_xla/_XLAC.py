"""The fake's stand-in for torch_xla's C extension: only the calls notebook_accel and the fake itself make."""
from . import _fake_runtime


def _xla_runtime_is_initialized() -> bool:
    return _fake_runtime.initialized


def _xla_computation_cache_is_initialized() -> bool:
    return _fake_runtime.compiled


def _xla_set_default_device(device) -> None:
    _fake_runtime.set_thread_device(int(str(device).rsplit(":", 1)[-1]))


def _xla_get_default_device_ordinal() -> int:
    return _fake_runtime.global_ordinal()


def _xla_get_device_ordinal(device) -> int:
    return _fake_runtime.ordinal_of(int(str(device).rsplit(":", 1)[-1]))


# Graph cuts. torch_xla 2.9: ``torch_xla.sync()`` calls ``_xla_step_marker(_xla_get_default_device(), [], wait=...)``
# and ``xm.unlazy`` / ``xm.save`` call ``_xla_sync_multi``; ``_xla_wait_device_ops`` takes real device names
# ("CPU:0", "TPU:0") and fails on "xla:0" with the C++ map's ``IndexError``, as the real one does.

def _xla_get_default_device() -> str:
    return f"xla:{_fake_runtime.thread_device_index()}"


def _xla_real_devices(devices):
    return [f"{_fake_runtime.device_type()}:{_fake_runtime.ordinal_of(int(str(d).rsplit(':', 1)[-1]))}"
            for d in devices]


def _xla_step_marker(device, devices, wait=True, reset_scope=True) -> None:
    _fake_runtime.cut_graph("step_marker")


def _xla_sync_multi(tensors, devices, wait=True, sync_xla_data=True) -> None:
    _fake_runtime.cut_graph("sync_multi")


def _xla_wait_device_ops(devices=()) -> None:
    for device in devices:
        if not str(device).startswith(("CPU:", "TPU:")):
            raise IndexError("unordered_map::at")
