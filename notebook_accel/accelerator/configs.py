"""HF accelerate's configuration objects, under the same names and fields, for code that builds them.

``Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])``,
``ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True, total_limit=3)``,
``DataLoaderConfiguration(split_batches=True)``... are plain dataclasses here: the :class:`~.accelerator.Accelerator`
reads them (see there for what each field does); HF accelerate is not imported.
"""
from __future__ import annotations

import dataclasses
import enum
import os
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = [
    "KwargsHandler",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "AutocastKwargs",
    "ProfileKwargs",
    "GradientAccumulationPlugin",
    "DataLoaderConfiguration",
    "ProjectConfiguration",
    "TorchDynamoPlugin",
    "PrecisionType",
    "LoggerType",
    "RNGType",
    "DynamoBackend",
    "DDPCommunicationHookType",
    "ParallelismConfig",
]


class _ListedEnum(str, enum.Enum):
    """A str Enum that compares equal to its value and lists its values (as HF's ``BaseEnum``)."""

    @classmethod
    def list(cls) -> List[str]:
        return [member.value for member in cls]

    def __str__(self) -> str:
        return str(self.value)


class PrecisionType(_ListedEnum):
    """The ``mixed_precision`` values (``fp8`` is HF's and refused here: see the parity page)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class LoggerType(_ListedEnum):
    """``log_with`` values: ``all`` (every installed one of ours), ``tensorboard``, ``wandb``, ``mlflow``; HF's other
    names are refused with the list of these."""

    ALL = "all"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"


class RNGType(_ListedEnum):
    TORCH = "torch"
    CUDA = "cuda"
    XLA = "xla"
    GENERATOR = "generator"


class DynamoBackend(_ListedEnum):
    """``torch.compile`` backends by HF's names (upper case); ``NO`` compiles nothing."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    CUDAGRAPHS = "CUDAGRAPHS"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    TVM = "TVM"


class DDPCommunicationHookType(_ListedEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class KwargsHandler:
    """Base of the ``*Kwargs`` classes: ``to_kwargs()`` gives the fields that differ from their defaults."""

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_kwargs(self) -> Dict[str, Any]:
        default = self.__class__().to_dict()
        return {name: value for name, value in self.to_dict().items() if default[name] != value}


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel`` (``find_unused_parameters=True``, ...).

    Example::

        Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = dataclasses.field(default_factory=dict)

    def to_kwargs(self) -> Dict[str, Any]:
        kwargs = super().to_kwargs()
        for name in ("comm_hook", "comm_wrapper", "comm_state_option"):
            kwargs.pop(name, None)
        return kwargs

    def communication_hook(self) -> Optional[Tuple[Any, Callable[..., Any]]]:
        """(state, hook) for ``DistributedDataParallel.register_comm_hook``, or None: torch's compression hooks
        ("fp16" / "bf16"), PowerSGD ("power_sgd" / "batched_power_sgd", its state built from
        ``comm_state_option``), a PowerSGD hook optionally wrapped by ``comm_wrapper`` ("fp16" / "bf16")."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
                    DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper}  # fmt: skip
        kind = DDPCommunicationHookType(self.comm_hook)
        hook = hooks.get(kind)
        if hook is None:
            return None
        wrapper = wrappers.get(DDPCommunicationHookType(self.comm_wrapper))
        if wrapper is not None:
            hook = wrapper(hook)
        state = None
        if kind in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
        return state, hook


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for fp16's ``torch.amp.GradScaler``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``: ``timeout`` (a ``timedelta``), ``backend``."""

    backend: Optional[str] = "nccl"
    init_method: Optional[str] = None
    timeout: Optional[timedelta] = None


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """``torch.autocast``'s ``enabled`` and ``cache_enabled`` for the prepared models and ``accelerator.autocast()``."""

    enabled: bool = True
    cache_enabled: Optional[bool] = None


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """``torch.profiler.profile``'s arguments for ``accelerator.profile()``; ``output_trace_dir``: each rank writes
    ``profile_<rank>.json`` (a Chrome trace) there when the block ends."""

    activities: Optional[List[str]] = None  # "cpu", "cuda" (default: what the device has)
    schedule_option: Optional[Dict[str, int]] = None  # wait, warmup, active, repeat, skip_first
    on_trace_ready: Optional[Callable[..., Any]] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None

    def build(self) -> Any:
        """The ``torch.profiler.profile`` these fields describe."""
        import torch

        names = self.activities
        if names is None:
            names = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        activity = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option else None
        return torch.profiler.profile(
            activities=[activity[name] for name in names], schedule=schedule, on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory, with_stack=self.with_stack,
            with_flops=self.with_flops, with_modules=self.with_modules,
        )


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """``num_steps`` micro-batches per optimizer step; ``sync_with_dataloader``: the last batch of a prepared loader
    also steps; ``sync_each_batch``: all-reduce every micro-batch (no ``no_sync``: less memory, more traffic).
    ``adjust_scheduler``: on accumulation steps the scheduler's step count still counts up (as HF)."""

    num_steps: Optional[int] = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards loaders. ``split_batches``: cut each batch between the ranks; ``even_batches=False``:
    no rank gets padded batches at the end of an epoch (ranks may then run different numbers of steps: use
    ``join_uneven_inputs``); ``use_seedable_sampler``: HF's data order either way, the same on every rank —
    ``False`` (HF's default): a shuffling sampler's generator is seeded once at ``prepare`` from a draw on the
    global torch RNG and never reseeded, each iteration starting from rank 0's state of it; ``True``: it is
    reseeded with ``data_seed`` (default: rank 0's ``torch.initial_seed()``) + the epoch at each epoch (HF's
    ``SeedableRandomSampler``); ``non_blocking``: copy pinned batches to the GPU asynchronously.
    ``dispatch_batches`` is accepted: every rank reads its own shard, whatever it says. ``use_stateful_dataloader`` (torchdata) is not offered."""

    split_batches: bool = False
    dispatch_batches: Optional[bool] = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: Optional[int] = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclasses.dataclass
class ProjectConfiguration:
    """Where a run writes. ``project_dir``: the checkpoints (``<project_dir>/checkpoints/checkpoint_<i>`` with
    ``automatic_checkpoint_naming``, the oldest removed beyond ``total_limit``); ``logging_dir``: the trackers'
    (default: ``project_dir``); ``iteration``: the number the next automatic checkpoint gets."""

    project_dir: Optional[str] = None
    logging_dir: Optional[str] = None
    automatic_checkpoint_naming: bool = False
    total_limit: Optional[int] = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: Optional[str] = None) -> None:
        """Set ``project_dir`` and, where unset, ``logging_dir`` to it."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        self.set_directories(self.project_dir)
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        if self.logging_dir is not None:
            self.logging_dir = os.fspath(self.logging_dir)


@dataclasses.dataclass
class TorchDynamoPlugin(KwargsHandler):
    """``torch.compile`` for prepared models: ``backend`` (HF's names, e.g. "inductor", "eager"), ``mode``,
    ``fullgraph``, ``dynamic``, ``options``."""

    backend: Optional[str] = None
    mode: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None
    options: Optional[Dict[str, Any]] = None
    disable: bool = False
    use_regional_compilation: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "NO")
        self.backend = DynamoBackend(str(self.backend).upper()).value

    @property
    def enabled(self) -> bool:
        return self.backend != DynamoBackend.NO.value and not self.disable

    def compile_kwargs(self) -> Dict[str, Any]:
        """What ``torch.compile`` takes from this plugin."""
        kwargs: Dict[str, Any] = {"backend": self.backend.lower()}
        for name in ("mode", "fullgraph", "dynamic", "options"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        return kwargs


class ParallelismConfig:
    """HF's device-mesh configuration (tensor, context, sequence parallelism): refused by name when built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from .absent import ABSENT_PARAMETERS, refuse_name

        refuse_name("ParallelismConfig", ABSENT_PARAMETERS["parallelism_config"])
