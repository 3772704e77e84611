"""The names HF code imports from ``accelerate.utils``, for code that runs unchanged with only the import changed::

    from notebook_accel.utils import set_seed, gather_object, ProjectConfiguration, DistributedDataParallelKwargs

Every function takes HF accelerate 1.x's parameters (names, positions, defaults); ``tests/test_accelerate_parity.py``
compares them with ``inspect.signature``. Submodules as HF's: ``.operations`` (the collectives,
``DistributedOperationException``), ``.dataclasses`` (configuration classes, plugins, enums), ``.random``
(``set_seed``, ``synchronize_rng_states``), ``.modeling`` (``get_max_memory``, ``merge_fsdp_weights``, the file
names), ``.imports`` (``is_*_available``, ``is_torch_version``), ``.deepspeed`` (``DummyOptim`` /
``DummyScheduler``), ``.tqdm``. docs/accelerate-parity.md lists what differs.
"""
from __future__ import annotations

from ..accelerator.checkpointing import load, save
from ..accelerator.partial_state import AcceleratorState, PartialState
from ..accelerator.utilities import (
    clear_device_cache,
    extract_model_from_parallel,
    find_executable_batch_size,
    patch_environment,
    release_memory,
    should_reduce_batch_size,
    wait_for_everyone,
)
from ..big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from ..plan.config import write_basic_config
from .dataclasses import *  # noqa: F401,F403 - the configuration classes, plugins and enums
from .dataclasses import __all__ as _dataclasses_all
from .deepspeed import DummyOptim, DummyScheduler
from .imports import *  # noqa: F401,F403 - the is_*_available table
from .imports import __all__ as _imports_all
from .modeling import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    convert_file_size_to_int,
    get_max_memory,
    merge_fsdp_weights,
)
from .operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    is_torch_tensor,
    listify,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
)
from .random import set_seed, synchronize_rng_state, synchronize_rng_states
from .tqdm import tqdm  # the function, over the submodule of the same name (as HF's)

__all__ = [
    "AcceleratorState", "DistributedOperationException", "DummyOptim", "DummyScheduler", "PartialState",
    "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "broadcast",
    "broadcast_object_list", "clear_device_cache", "concatenate", "convert_file_size_to_int", "copy_tensor_to_devices",
    "cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model", "extract_model_from_parallel",
    "find_batch_size", "find_device", "find_executable_batch_size", "gather", "gather_object", "get_max_memory",
    "infer_auto_device_map", "is_torch_tensor", "listify", "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model", "merge_fsdp_weights", "pad_across_processes", "patch_environment",
    "recursively_apply", "reduce", "release_memory", "send_to_device", "set_seed", "should_reduce_batch_size",
    "synchronize_rng_state", "synchronize_rng_states", "tqdm", "wait_for_everyone", "write_basic_config",
    *_dataclasses_all, *_imports_all,
]  # fmt: skip
__all__ += ["load", "save"]  # HF's checkpoint file helpers (accelerator/checkpointing.py)
