"""``accelerate.utils.dataclasses``' names: the configuration classes, plugins and enums."""
from __future__ import annotations

from ..accelerator.configs import (
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
from ..accelerator.fsdp import FullyShardedDataParallelPlugin
from ..accelerator.state import DistributedType
from ..accelerator.zero import DeepSpeedPlugin

__all__ = ["AutocastKwargs", "DataLoaderConfiguration", "DDPCommunicationHookType", "DeepSpeedPlugin",
           "DistributedDataParallelKwargs", "DistributedType", "DynamoBackend", "FullyShardedDataParallelPlugin",
           "GradientAccumulationPlugin", "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler", "LoggerType",
           "PrecisionType", "ProfileKwargs", "ProjectConfiguration", "RNGType", "TorchDynamoPlugin"]  # fmt: skip
