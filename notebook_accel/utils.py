"""The names HF code imports from ``accelerate.utils``, for code that runs unchanged with only the import changed::

    from notebook_accel.utils import set_seed, gather_object, ProjectConfiguration, DistributedDataParallelKwargs

Functions: ``set_seed``, ``send_to_device``, ``gather``, ``gather_object``, ``broadcast``, ``broadcast_object_list``,
``reduce``, ``pad_across_processes``, ``wait_for_everyone``, ``find_executable_batch_size``, ``release_memory``,
``extract_model_from_parallel``, ``patch_environment``, ``recursively_apply``, ``write_basic_config``. Classes: the
``*Kwargs`` handlers, ``GradientAccumulationPlugin``, ``DataLoaderConfiguration``, ``ProjectConfiguration``,
``TorchDynamoPlugin``, ``DeepSpeedPlugin``, ``FullyShardedDataParallelPlugin``, ``DistributedType``,
``PrecisionType``, ``LoggerType``, ``RNGType``, ``DynamoBackend``, and ``PartialState`` / ``AcceleratorState``.
docs/accelerate-parity.md lists what differs.
"""
from __future__ import annotations

import importlib.util

from .accelerator.checkpointing import load, save
from .accelerator.configs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    LoggerType,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    TorchDynamoPlugin,
)
from .accelerator.fsdp import FullyShardedDataParallelPlugin
from .accelerator.operations import broadcast, gather, pad_across_processes, send_to_device
from .accelerator.partial_state import AcceleratorState, PartialState
from .accelerator.rng import set_seed
from .accelerator.state import DistributedType
from .accelerator.utilities import (
    broadcast_object_list,
    clear_device_cache,
    extract_model_from_parallel,
    find_executable_batch_size,
    gather_object,
    patch_environment,
    recursively_apply,
    reduce,
    release_memory,
    should_reduce_batch_size,
    wait_for_everyone,
)
from .accelerator.zero import DeepSpeedPlugin
from .plan.config import write_basic_config

__all__ = [
    "AcceleratorState", "AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType",
    "DeepSpeedPlugin", "DistributedDataParallelKwargs", "DistributedType", "DynamoBackend",
    "FullyShardedDataParallelPlugin", "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs",
    "KwargsHandler", "LoggerType", "PartialState", "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "RNGType",
    "TorchDynamoPlugin", "broadcast", "broadcast_object_list", "clear_device_cache", "extract_model_from_parallel",
    "find_executable_batch_size", "gather", "gather_object", "is_mlflow_available", "is_tensorboard_available",
    "is_wandb_available", "pad_across_processes", "patch_environment", "recursively_apply", "reduce",
    "release_memory", "send_to_device", "set_seed", "should_reduce_batch_size", "wait_for_everyone",
    "write_basic_config",
]  # fmt: skip
__all__ += ["load", "save"]  # HF's checkpoint file helpers (accelerator/checkpointing.py)


def is_tensorboard_available() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


def is_wandb_available() -> bool:
    return importlib.util.find_spec("wandb") is not None


def is_mlflow_available() -> bool:
    return importlib.util.find_spec("mlflow") is not None
