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
