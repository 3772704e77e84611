"""Fake ``torch_xla.runtime`` (see the package docstring). As in torch_xla 2.9, the counts that ask the PJRT
client (``global_device_count``, ``addressable_device_count`` and those built on it, ``process_index``,
``process_count``) start it: the runtime is initialized afterwards, and a later ``xmp.spawn`` refuses."""
import os

from . import _fake_runtime


def device_type():
    return _fake_runtime.device_type()


def world_size() -> int:
    return _fake_runtime.world_size()


def global_ordinal() -> int:
    return _fake_runtime.global_ordinal()


def local_ordinal() -> int:
    return _fake_runtime.local_process_rank() * addressable_device_count() + _fake_runtime.thread_device_index()


def local_process_count() -> int:
    return int(os.environ.get("PJRT_LOCAL_PROCESS_COUNT", "1"))


def addressable_device_count() -> int:
    _fake_runtime.initialize()  # _XLAC._xla_num_devices()
    return _fake_runtime.devices_per_process()


def local_device_count() -> int:
    return local_process_count() * addressable_device_count()


def global_device_count() -> int:
    _fake_runtime.initialize()  # _XLAC._xla_get_all_devices()
    return _fake_runtime.num_local_processes() * _fake_runtime.devices_per_process()


def process_index() -> int:
    _fake_runtime.initialize()
    return _fake_runtime.local_process_rank()


def process_count() -> int:
    _fake_runtime.initialize()
    return _fake_runtime.num_local_processes()


def host_index() -> int:
    return 0


def is_bf16_supported() -> bool:
    return True


def is_spmd() -> bool:
    return False


def initialize_cache(path: str, readonly: bool = False) -> None:
    """As torch_xla 2.9: refuses once the runtime is up, else records the cache in the environment."""
    assert not _fake_runtime.compiled, "Computation cache has already been initialized"
    os.environ["XLA_PERSISTENT_CACHE_PATH"] = path
    os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] = "1" if readonly else "0"
