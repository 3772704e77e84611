"""The :class:`Accelerator`: what a training function writes to run unchanged on 1 or N processes."""
from __future__ import annotations

import builtins
import contextlib
import gc
import os
import warnings
from pathlib import Path
from typing import Any, ContextManager, Dict, Iterable, Iterator, List, Optional, Union

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from . import op_checker, operations
from .absent import ABSENT_PARAMETERS, AbsentMembers, refuse
from .checkpointing import load_checkpoint, load_model_weights, save, save_checkpoint, save_sharded_weights
from .data_loader import PreparedDataLoader, SkippedLoader, XlaDeviceLoader, prepare_data_loader
from .fsdp import FullyShardedDataParallelPlugin, full_state_dict, is_sharded, shard_model
from .gradient_state import GradientState
from .memory import held_bytes, memory_line, release_freed_memory, return_large_blocks_when_freed
from .optimizer import AcceleratedOptimizer, move_state_to_params, switch_parameters
from .configs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from .partial_state import AcceleratorState, remember_state
from .placement import check_model_placement
from .process_control import ProcessControl
from .project import ProjectMembers, checkpoint_number
from .time_limit import TimeLimitMembers
from .precision import (
    add_autocast_to_forward,
    add_low_precision_forward,
    autocast_context,
    check_precision_supported,
    make_grad_scaler,
    remove_autocast_from_forward,
    resolve_mixed_precision,
)
from .rng import set_seed as _set_seed
from .rng import torch_random_state
from .sharded_init import ShardedInit, SkippedInit
from .scheduler import AcceleratedScheduler
from .state import DistributedType, one_rank_group, resolve_process_state
from .tracking import GeneralTracker, TrackingMembers, filter_trackers
from .zero import DeepSpeedOptimizer, DeepSpeedPlugin, build_engine, engine_state_dict, filled_config, import_deepspeed
from .zero import is_engine, zero_init

__all__ = ["Accelerator"]

Tree = Any
_PREPARE_ORDER = ("model", "optimizer", "data_loader", "scheduler")  # each needs the ones before it


@contextlib.contextmanager
def _then_trimmed(first: ContextManager[Any], second: ContextManager[Any]) -> Iterator[None]:
    """Both contexts; then the memory the whole parameters took is given back (see release_freed_memory)."""
    with first, second:
        yield
    release_freed_memory()


def _is_scheduler(obj: Any) -> bool:
    lr_scheduler = torch.optim.lr_scheduler
    return isinstance(obj, (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau))


_HANDLER_ATTRIBUTES = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
}
_RNG_TYPES = ("torch", "cuda", "xla", "generator")


class Accelerator(ProcessControl, TrackingMembers, ProjectMembers, TimeLimitMembers, AbsentMembers):
    """Run a plain PyTorch training loop on CPU, one GPU, N GPUs or TPU cores, with mixed precision.

    Inside a function started by ``notebook_launcher`` (or torchrun, or nothing at all: one process),
    add four things to the loop: ``Accelerator()``, ``prepare``, ``backward`` and, for evaluation,
    ``gather_for_metrics``.

    Example::

        def train():
            accelerator = Accelerator()                    # rank, world, device, precision: from the launch
            model = torch.nn.Linear(10, 2)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            loader = DataLoader(dataset, batch_size=16, shuffle=True)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for x, y in loader:                            # this rank's shard, already on the device
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            return accelerator.unwrap_model(model).state_dict()

        notebook_launcher(train, num_processes=2)

    Its members, by the module of this package that defines each (the rest of what they do is in the modules the
    package map of ``notebook_accel.accelerator`` lists; a test checks this list against the class):

    - :mod:`.accelerator` (``Accelerator``): ``accumulate``, ``autocast``, ``backward``, ``clear``,
      ``clip_grad_norm_``, ``clip_grad_value_``, ``device``, ``dispatch_batches``, ``distributed_type``,
      ``end_training``, ``even_batches``, ``fp8_backend``, ``free_memory``, ``gather``, ``gather_for_metrics``,
      ``get_state_dict``, ``gradient_accumulation_steps``, ``init_module``, ``is_composable_parallelism_enabled``,
      ``is_fsdp2``, ``is_local_main_process``, ``is_main_process``, ``load_model``, ``load_state``,
      ``local_main_process_first``, ``local_process_index``, ``main_process_first``, ``mixed_precision``,
      ``multi_device``, ``non_blocking``, ``num_processes``, ``optimizer_step_was_skipped``, ``pad_across_processes``,
      ``parallelism_config``, ``prepare``, ``prepare_data_loader``, ``prepare_model``, ``prepare_optimizer``,
      ``prepare_scheduler``, ``print``, ``process_index``, ``profile``, ``reduce``, ``save``, ``save_model``,
      ``save_state``, ``set_seed``, ``should_save_model``, ``skip_first_batches``, ``sync_gradients``,
      ``torch_device_mesh``, ``unscale_gradients``, ``unwrap_model``, ``use_distributed``, ``use_seedable_sampler``,
      ``use_stateful_dataloader``, ``verify_device_map``, ``wait_for_everyone``
    - :mod:`.process_control` (``ProcessControl``): ``check_trigger``, ``is_last_process``, ``join_uneven_inputs``,
      ``no_sync``, ``on_last_process``, ``on_local_main_process``, ``on_local_process``, ``on_main_process``,
      ``on_process``, ``set_trigger``, ``split_between_processes``, ``trigger_sync_in_backward``
    - :mod:`.project` (``ProjectMembers``): ``latest_checkpoint``, ``logging_dir``, ``project_dir``,
      ``register_for_checkpointing``, ``register_load_state_pre_hook``, ``register_save_state_pre_hook``,
      ``save_iteration``
    - :mod:`.time_limit` (``TimeLimitMembers``): ``optimizer_steps``, ``should_checkpoint``
    - :mod:`.tracking` (``TrackingMembers``): ``get_tracker``, ``init_trackers``, ``log``
    - :mod:`.absent` (``AbsentMembers``): ``context_parallel_rank``, ``data_parallel_rank``,
      ``data_parallel_shard_rank``, ``deepspeed_ulysses_dl_adapter``, ``lomo_backward``, ``maybe_context_parallel``,
      ``pipeline_parallel_rank``, ``tensor_parallel_rank``

    Args:
        cpu: use the CPU even when an accelerator is present.
        mixed_precision: "no", "fp16" (CUDA) or "bf16"; None reads the launcher's choice
            (``ACCELERATE_MIXED_PRECISION``).
        gradient_accumulation_steps: optimizer steps happen every this many ``accumulate`` blocks.
        device_placement: move prepared models and every batch to ``device``.
        split_batches: cut each loader batch between the ranks (the batch size is global) instead of
            giving each rank whole batches (the batch size is per process; the default).
        seed: if given, ``set_seed(seed)`` right away (before any model is built from it).
        ddp_kwargs: extra keyword arguments for ``DistributedDataParallel`` (e.g.
            ``find_unused_parameters=True``).
        fsdp_plugin: shard models with FSDP2 instead of replicating them with DDP (see
            :class:`FullyShardedDataParallelPlugin`); None reads HF accelerate's ``ACCELERATE_USE_FSDP`` /
            ``FSDP_*`` environment.
        deepspeed_plugin: train with DeepSpeed ZeRO (see :class:`DeepSpeedPlugin`); None reads HF accelerate's
            ``ACCELERATE_USE_DEEPSPEED`` environment.

    HF accelerate's other parameters, with its meaning (``docs/accelerate-parity.md`` says where ours differs):
    ``dataloader_config`` (a ``DataLoaderConfiguration``), ``rng_types``, ``log_with`` and ``project_dir`` /
    ``project_config`` (trackers, checkpoint naming), ``gradient_accumulation_plugin``,
    ``step_scheduler_with_optimizer``, ``kwargs_handlers`` (``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
    ``InitProcessGroupKwargs``, ``AutocastKwargs``, ``ProfileKwargs``), ``dynamo_backend`` / ``dynamo_plugin``
    (``torch.compile`` in ``prepare``). ``megatron_lm_plugin``, ``torch_tp_plugin``, ``parallelism_config``,
    ``deepspeed_plugins`` and ``mixed_precision="fp8"`` raise ``NotImplementedError`` saying what to use instead.
    """

    def __init__(
        self,
        # HF's parameters, in HF's order (positional use lands on the same parameter); ours keyword-only after them
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: Optional[str] = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: Optional[DataLoaderConfiguration] = None,
        deepspeed_plugin: Optional[DeepSpeedPlugin] = None,
        fsdp_plugin: Optional[FullyShardedDataParallelPlugin] = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: Optional[List[str]] = None,
        log_with: Any = None,
        project_dir: Optional[str] = None,
        project_config: Optional[ProjectConfiguration] = None,
        gradient_accumulation_plugin: Optional[GradientAccumulationPlugin] = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Optional[List[KwargsHandler]] = None,
        dynamo_backend: Optional[str] = None,
        dynamo_plugin: Optional[TorchDynamoPlugin] = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        *,
        seed: Optional[int] = None,
        ddp_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        if fsdp_plugin is not None and deepspeed_plugin is not None:
            raise ValueError("fsdp_plugin and deepspeed_plugin both shard the model: give one of them")
        deepspeed_plugin = self._refuse_absent_parameters(locals(), deepspeed_plugin)
        self._read_kwargs_handlers(kwargs_handlers)
        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}
        # init_kwargs only when there are some: tests stand in for resolve_process_state(cpu) on fake TPU hosts
        extra = {"init_kwargs": init_kwargs} if init_kwargs else {}
        remember_state(resolve_process_state(cpu=cpu, **extra))  # PartialState() is this state from now on
        self._mixed_precision = resolve_mixed_precision(mixed_precision)
        # HF's AcceleratorState: what the rest of the process shares (AcceleratorState(), accelerator.state)
        self.state = AcceleratorState(self._mixed_precision, _from_accelerator=True)
        check_precision_supported(self._mixed_precision, self.state.device)
        if deepspeed_plugin is None and fsdp_plugin is None:
            deepspeed_plugin = DeepSpeedPlugin.from_environment()
        if deepspeed_plugin is None:
            fsdp_plugin = fsdp_plugin or FullyShardedDataParallelPlugin.from_environment()
        self.fsdp_plugin = self._check_fsdp_plugin(fsdp_plugin)
        self.deepspeed_plugin = self._check_deepspeed_plugin(deepspeed_plugin)
        self.state.fsdp_plugin, self.state.deepspeed_plugin = self.fsdp_plugin, self.deepspeed_plugin
        if self.deepspeed_plugin is not None or self.fsdp_plugin is not None:
            self.state.distributed_type = (DistributedType.DEEPSPEED if self.deepspeed_plugin is not None
                                           else DistributedType.FSDP)  # fmt: skip
        if self.deepspeed_plugin is not None:
            gradient_accumulation_steps = self._accumulation_with(self.deepspeed_plugin, gradient_accumulation_steps)
        sharded = (self.fsdp_plugin or self.deepspeed_plugin) and self.num_processes > 1
        if sharded and self.state.device.type == "cpu":
            # sharding was chosen to save memory: glibc's heap would keep what each step frees (see there)
            return_large_blocks_when_freed()
        # DeepSpeed scales an fp16 loss itself
        self.scaler = None if self.deepspeed_plugin else make_grad_scaler(self._mixed_precision, self.state.device)
        if self.scaler is not None and self.scaler_handler is not None:
            kwargs = self.scaler_handler.to_kwargs()  # the fields changed from HF's defaults (torch's own)
            self.scaler = (torch.amp.GradScaler(self.state.device.type, **kwargs) if hasattr(torch.amp, "GradScaler")
                           else torch.cuda.amp.GradScaler(**kwargs))  # fmt: skip
        if gradient_accumulation_plugin is not None:
            if gradient_accumulation_steps != 1:
                raise ValueError("You can only pass one of `gradient_accumulation_steps` and "
                                 "`gradient_accumulation_plugin`.")  # fmt: skip
            gradient_accumulation_steps = gradient_accumulation_plugin.num_steps or 1
        else:
            gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=gradient_accumulation_steps)
        self.gradient_accumulation_plugin = gradient_accumulation_plugin
        self.gradient_state = GradientState(gradient_accumulation_steps)
        self.dataloader_config = dataloader_config if dataloader_config is not None else DataLoaderConfiguration(
            split_batches=split_batches)  # fmt: skip
        if self.dataloader_config.use_stateful_dataloader:
            refuse("DataLoaderConfiguration(use_stateful_dataloader=True)", "torchdata's StatefulDataLoader is not "
                   "offered; resume mid-epoch with load_state and skip_first_batches")  # fmt: skip
        split_batches = split_batches or self.dataloader_config.split_batches
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = self._check_rng_types(rng_types)
        if dynamo_plugin is not None and dynamo_backend is not None:
            raise ValueError("You cannot pass in both `dynamo_plugin` and `dynamo_backend`, please only pass in one.")
        self.dynamo_plugin = self.state.dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
        self._init_project(project_dir, project_config)
        self.log_with = filter_trackers(log_with, self.logging_dir)
        self.trackers: List[GeneralTracker] = []
        self._deepspeed_engine: Any = None
        self.device_placement = device_placement
        self.split_batches = split_batches
        self.ddp_kwargs: Dict[str, Any] = dict(ddp_kwargs or {})
        if self.ddp_handler is not None:
            self.ddp_kwargs = {**self.ddp_handler.to_kwargs(), **self.ddp_kwargs}
        self._models: List[torch.nn.Module] = []
        self._optimizers: List[AcceleratedOptimizer] = []
        self._schedulers: List[AcceleratedScheduler] = []
        self._data_loaders: List[PreparedDataLoader] = []
        self._accumulation_count = 0
        self._watch_time_limit()
        self._moved_parameters: Dict[torch.nn.Parameter, torch.nn.Parameter] = {}  # old -> new, see prepare_model
        self._recordings: List[ShardedInit] = []  # models built by init_module under FSDP2, until prepared
        self._trim_after_first_backward = False
        if seed is not None:
            self.set_seed(seed)

    def _check_fsdp_plugin(self, plugin: Optional[FullyShardedDataParallelPlugin]) -> Optional[Any]:
        """The plugin to shard with, or None; refuses what FSDP2 cannot do here before any model is built."""
        if plugin is None:
            return None
        if not isinstance(plugin, FullyShardedDataParallelPlugin):
            raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, not {type(plugin).__name__}")
        if self.distributed_type == DistributedType.XLA:
            raise ValueError(
                "fsdp_plugin: FSDP2 shards over a torch.distributed process group, which TPU cores here do not "
                "use (they talk through torch_xla's collectives); on TPU, train without the plugin (or use "
                "torch_xla's own SPMD/FSDP)"
            )
        if self.num_processes == 1 and not (plugin.cpu_offload and self.device.type == "cuda"):
            warnings.warn(
                "fsdp_plugin with one process: there is nothing to shard, so the model is trained as it is "
                "(launch with num_processes > 1 to shard it, or on a GPU give cpu_offload=True to keep its "
                "parameters, gradients and optimizer state in host memory)",
                stacklevel=3,
            )
            return None
        if self._mixed_precision == "fp16":
            raise ValueError(
                "fsdp_plugin with mixed_precision='fp16': the fp16 loss scaler does not handle sharded gradients "
                "here; use mixed_precision='bf16' (or 'no')"
            )
        return plugin

    def _check_deepspeed_plugin(self, plugin: Optional[DeepSpeedPlugin]) -> Optional[DeepSpeedPlugin]:
        if plugin is None:
            return None
        if not isinstance(plugin, DeepSpeedPlugin):
            raise TypeError(f"deepspeed_plugin must be a DeepSpeedPlugin, not {type(plugin).__name__}")
        if self.distributed_type == DistributedType.XLA:
            raise ValueError("deepspeed_plugin: DeepSpeed does not run on TPU cores; train without the plugin")
        # One process still gets DeepSpeed's engine, as with HF accelerate: ZeRO-Offload (optimizer state, and
        # under ZeRO-3 parameters, in host memory) is how one GPU trains a model bigger than its memory.
        import_deepspeed(on_cpu=self.device.type == "cpu")  # a missing install says so now, before any model is built
        return plugin

    @staticmethod
    def _accumulation_with(plugin: DeepSpeedPlugin, given: int) -> int:
        from_plugin = plugin.gradient_accumulation_steps
        if from_plugin is None or from_plugin == given:
            return given
        if given != 1:
            raise ValueError(
                f"gradient_accumulation_steps={given} but the DeepSpeed plugin says {from_plugin}: give it in one place"
            )
        return from_plugin

    @staticmethod
    def _refuse_absent_parameters(given: Dict[str, Any], deepspeed_plugin: Optional[DeepSpeedPlugin]) -> Any:
        """HF's parameters we do not offer raise here, before any process group is made; a ``deepspeed_plugins``
        of one plugin is that plugin."""
        plugins = given["deepspeed_plugins"]
        if plugins is not None:
            if deepspeed_plugin is not None:
                raise ValueError("You cannot pass in both `deepspeed_plugins` and `deepspeed_plugin`.")
            if isinstance(plugins, dict) and len(plugins) == 1:
                plugins = next(iter(plugins.values()))
            if isinstance(plugins, dict):
                refuse("__init__(deepspeed_plugins=...)", ABSENT_PARAMETERS["deepspeed_plugins"])
            deepspeed_plugin = plugins
        for name in ("megatron_lm_plugin", "torch_tp_plugin", "parallelism_config"):
            if given[name] is not None:
                refuse(f"__init__({name}=...)", ABSENT_PARAMETERS[name])
        if given["mixed_precision"] is not None and str(given["mixed_precision"]) == "fp8":
            refuse("__init__(mixed_precision='fp8')", ABSENT_PARAMETERS["mixed_precision='fp8'"])
        return deepspeed_plugin

    def _read_kwargs_handlers(self, handlers: Optional[List[KwargsHandler]]) -> None:
        """``kwargs_handlers``: at most one of each kind, kept as HF's attributes (``ddp_handler``, ...)."""
        for attribute in _HANDLER_ATTRIBUTES.values():
            setattr(self, attribute, None)
        for handler in handlers or []:
            attribute = _HANDLER_ATTRIBUTES.get(type(handler))
            if attribute is None:
                raise ValueError(f"Unsupported kwargs handler passed: {handler!r}; this Accelerator takes "
                                 f"{', '.join(cls.__name__ for cls in _HANDLER_ATTRIBUTES)}")  # fmt: skip
            if getattr(self, attribute) is not None:
                raise ValueError(f"You can only pass one {type(handler).__name__} in `kwargs_handlers`.")
            setattr(self, attribute, handler)

    @staticmethod
    def _check_rng_types(rng_types: Optional[List[str]]) -> List[str]:
        """HF's names, checked: a prepared loader's sampler generator is always synchronised ("generator"), the
        global RNGs named ("torch", "cuda") take rank 0's state at each of its iterations' start, as on HF."""
        chosen = [str(name) for name in (rng_types if rng_types is not None else ["generator"])]
        unknown = [name for name in chosen if name not in _RNG_TYPES]
        if unknown:
            raise ValueError(f"rng_types: unknown {unknown}; choose among {list(_RNG_TYPES)}")
        return chosen

    # ------------------------------------------------------------------------------------------ where am I
    @property
    def device(self) -> torch.device:
        """The device of this rank: ``cuda:<local rank>``, ``xla``, ``mps`` or ``cpu``."""
        return self.state.device

    @property
    def process_index(self) -> int:
        """Global rank of this process (0 .. num_processes - 1)."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return self.state.local_process_index

    @property
    def num_processes(self) -> int:
        """Number of processes (ranks) in the launch."""
        return self.state.num_processes

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0 (do logging and saving here)."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on the first rank of each node."""
        return self.state.is_local_main_process

    @property
    def mixed_precision(self) -> str:
        """"no", "fp16" or "bf16"."""
        return self._mixed_precision

    @property
    def distributed_type(self) -> DistributedType:
        """NO, MULTI_CPU, MULTI_GPU or XLA; DEEPSPEED or FSDP with a sharding plugin (as HF): ``state``'s, which
        HF code may assign (``accelerator.state.distributed_type = ...``)."""
        return self.state.distributed_type

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.accumulation_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.accumulation_steps = steps

    @property
    def multi_device(self) -> bool:
        """True with several processes (HF: on several GPUs/accelerators; here CPU ranks count too)."""
        return self.num_processes > 1

    @property
    def is_fsdp2(self) -> bool:
        """True when models are sharded with FSDP2 (an ``fsdp_plugin`` on more than one process)."""
        return self.fsdp_plugin is not None

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return self.is_fsdp2

    @property
    def parallelism_config(self) -> None:
        """Always None: no ``ParallelismConfig`` here (see ``tensor_parallel_rank``)."""
        return None

    @property
    def torch_device_mesh(self) -> None:
        """Always None (no ``ParallelismConfig``); FSDP2 builds its own one-dimensional mesh."""
        return None

    @property
    def should_save_model(self) -> bool:
        return True

    @property
    def fp8_backend(self) -> str:
        """``"NO"``: fp8 training is not offered (``mixed_precision="fp8"`` raises)."""
        return "NO"

    @property
    def dispatch_batches(self) -> bool:
        """False: every rank reads its own shard (HF's dispatch from rank 0 is not used; the batches are the same)."""
        return False

    @property
    def even_batches(self) -> bool:
        """Whether prepared loaders pad the end of an epoch so every rank gets as many batches."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value
        for loader in self._data_loaders:
            for shard in (loader.batch_sampler, loader.sampler):
                if hasattr(shard, "even_batches"):
                    shard.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        return False

    @property
    def sync_gradients(self) -> bool:
        """True when the current step ends an accumulation cycle: the optimizer will really step."""
        return self.gradient_state.sync_gradients

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when the last optimizer step was skipped because fp16 gradients overflowed."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    def __repr__(self) -> str:
        return (
            f"Accelerator(device={self.device}, process {self.process_index}/{self.num_processes}, "
            f"distributed_type={self.distributed_type.value}, mixed_precision={self.mixed_precision!r})"
        )

    # ------------------------------------------------------------------------------------- building a model
    def init_module(self, empty_init: bool = False) -> ContextManager[Any]:
        """Build the model inside this block, and no rank holds it whole under FSDP2 or ZeRO-3 (every rank builds
        it, keeping only its part); elsewhere the block changes nothing.

        - FSDP2: parameters are made on the meta device while this rank records its shard of each as it is
          initialised (``torch.nn.init``, fills, slices, ``copy.deepcopy``...); ``prepare`` allocates the shards and
          fills them. The weights are exactly those of the same construction outside the block, from rank 0's random
          state (as DDP, and ``prepare`` without this block, start every rank from rank 0's weights).
        - ZeRO-3: ``deepspeed.zero.Init`` with the plugin's config (each module is partitioned as soon as it is
          built, to rank 0's values).
        - DDP, one process, TPU, ZeRO-1/2: every rank needs the whole model anyway; a plain block.

        ``empty_init=True`` skips the initialisation (``torch.nn.init`` does nothing, FSDP2 shards are left
        uninitialised): faster, for weights loaded right after ``prepare`` (:meth:`load_model`, ``load_state``).

        Example::

            with accelerator.init_module():
                model = MyTransformer()          # under FSDP2: no memory yet
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer = accelerator.prepare(model, optimizer)   # each rank: its shards, initialised
        """
        if self.fsdp_plugin is not None:
            return self._recording(empty_init)
        if (self.deepspeed_plugin is not None and self.deepspeed_plugin.zero_stage == 3
                and self.deepspeed_plugin.zero3_init_flag is not False):  # HF's switch for zero.Init
            partitioned = zero_init(self.deepspeed_plugin, accumulation=self.gradient_accumulation_steps,
                                    world=self.num_processes, mixed_precision=self._mixed_precision)  # fmt: skip
            return _then_trimmed(partitioned, SkippedInit() if empty_init else contextlib.nullcontext())
        return SkippedInit() if empty_init else contextlib.nullcontext()

    @contextlib.contextmanager
    def _recording(self, empty_init: bool) -> Iterator[ShardedInit]:
        recording = ShardedInit(self.num_processes, self.process_index, empty=empty_init)
        with torch_random_state(operations.broadcast_object(torch.get_rng_state())):
            with _then_trimmed(recording, contextlib.nullcontext()):
                yield recording
        self._recordings.append(recording)

    def _recorded_shards(self, model: torch.nn.Module) -> Optional[Dict[str, Optional[torch.Tensor]]]:
        """This rank's recorded shards of a model built by :meth:`init_module` under FSDP2 (None for any other)."""
        for recording in self._recordings:
            if recording.owns(model):
                return recording.take(model)
        return None

    # -------------------------------------------------------------------------------------------- prepare
    def prepare(self, *objects: Any, device_placement: Optional[List[bool]] = None) -> Any:
        """Prepare models, optimizers, data loaders and LR schedulers; returns them in the same order.

        - a model is moved to ``device`` (and runs under autocast with mixed precision) and wrapped in
          DistributedDataParallel when there are several processes;
        - an optimizer handles gradient accumulation and fp16 loss scaling in ``step()``;
        - a DataLoader yields this rank's shard of every epoch, on the device;
        - a scheduler steps with real optimizer steps only, ``num_processes`` times each (as HF accelerate).

        A single object comes back as itself, several as a tuple. ``device_placement``: one flag per object
        (HF's), overriding the Accelerator's for that object.

        Example::

            model, optimizer, train_loader, scheduler = accelerator.prepare(
                model, optimizer, train_loader, scheduler)
        """
        kinds = [self._kind_of(obj, position) for position, obj in enumerate(objects)]
        if device_placement is not None and len(device_placement) != len(objects):
            raise ValueError(f"device_placement has {len(device_placement)} flags for {len(objects)} objects")
        if self.deepspeed_plugin is not None and "model" in kinds:
            return self._prepare_deepspeed(objects, kinds)
        prepared = list(objects)
        for kind in _PREPARE_ORDER:
            for position, obj in enumerate(objects):
                if kinds[position] == kind:
                    with self._placement(None if device_placement is None else device_placement[position]):
                        prepared[position] = getattr(self, f"prepare_{kind}")(obj)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    @contextlib.contextmanager
    def _placement(self, device_placement: Optional[bool]) -> Iterator[None]:
        """``device_placement`` (HF's per-object flag) instead of the Accelerator's inside the block; None: as is."""
        default = self.device_placement
        if device_placement is not None:
            self.device_placement = device_placement
        try:
            yield
        finally:
            self.device_placement = default

    @staticmethod
    def _kind_of(obj: Any, position: int) -> Optional[str]:
        if isinstance(obj, (AcceleratedOptimizer, AcceleratedScheduler, PreparedDataLoader)):
            return None  # already prepared: returned unchanged
        if isinstance(obj, torch.nn.Module):
            return "model"
        if isinstance(obj, torch.optim.Optimizer):
            return "optimizer"
        if isinstance(obj, DataLoader):
            return "data_loader"
        if _is_scheduler(obj):
            return "scheduler"
        raise TypeError(
            f"prepare() got a {type(obj).__module__}.{type(obj).__qualname__} (argument {position}); it accepts "
            "torch.nn.Module (models), torch.optim.Optimizer, torch.utils.data.DataLoader and "
            "torch.optim.lr_scheduler.LRScheduler objects. Wrap a Dataset in a DataLoader first."
        )

    def prepare_model(self, model: torch.nn.Module, device_placement: Optional[bool] = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Move ``model`` to the device, add autocast for mixed precision, wrap it in DDP for N > 1 (or shard
        it with FSDP2 when the Accelerator has an ``fsdp_plugin``).

        ``device_placement``: overrides the Accelerator's for this model. ``evaluation_mode=True`` (HF's): a model
        for inference only — placed, autocast and compiled, never wrapped in DDP (nor sharded)."""
        with self._placement(device_placement):
            return self._prepare_model(model, evaluation_mode)

    def _prepare_model(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        if evaluation_mode and self.fsdp_plugin is not None:
            raise NotImplementedError("prepare_model(evaluation_mode=True) with an fsdp_plugin is not offered: "
                                      "prepare the model without evaluation_mode (FSDP2 shards it), or use an "
                                      "Accelerator without fsdp_plugin for inference")  # fmt: skip
        if self.deepspeed_plugin is not None and not is_engine(model):
            raise ValueError("under DeepSpeed, prepare the model together with its optimizer and DataLoader: "
                             "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)")
        if isinstance(model, DistributedDataParallel) or is_sharded(model) or is_engine(model):
            if model not in self._models:
                self._models.append(model)
            return model
        recorded = self._recorded_shards(model) if self.fsdp_plugin is not None else None
        if self.fsdp_plugin is not None and recorded is None:
            check_model_placement(model, self.device, "FSDP2")
        if recorded is not None:  # its parameters are on the meta device (FSDP2 allocates them), its buffers real
            for module in model.modules():
                module._buffers.update({name: buffer.to(self.device) for name, buffer in module._buffers.items()
                                        if buffer is not None})  # fmt: skip
        elif self.device_placement:
            before = dict(model.named_parameters())
            model = model.to(self.device)
            # Moving to an XLA device makes new Parameter objects (CPU and XLA tensors cannot share a
            # TensorImpl): remember them, so an optimizer built on the old ones is pointed at the new ones.
            for name, param in model.named_parameters():
                if name in before and before[name] is not param:
                    self._moved_parameters[before[name]] = param
        if self.autocast_handler is None or self.autocast_handler.enabled:
            add_autocast_to_forward(model, self.device, self._mixed_precision)
        if evaluation_mode:
            pass  # inference only: no gradients to synchronize
        elif self.num_processes > 1 and self.distributed_type == DistributedType.XLA:
            # No DDP on XLA: the optimizer step all-reduces the gradients with torch_xla's collective. What
            # DDP would do at construction still matters: every replica starts from rank 0's weights (device
            # threads share one torch RNG, so their own inits differ).
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(model)
        elif self.fsdp_plugin is not None:
            self._shard(model, recorded)
            self._trim_after_first_backward = True
            release_freed_memory()
        elif self.num_processes > 1:
            options = dict(self.ddp_kwargs)
            if self.device.type == "cuda":
                options.setdefault("device_ids", [self.device.index])
                options.setdefault("output_device", self.device.index)
            model = DistributedDataParallel(model, **options)
            hook = self.ddp_handler.communication_hook() if self.ddp_handler is not None else None
            if hook is not None:
                model.register_comm_hook(state=hook[0], hook=hook[1])
        if self.dynamo_plugin.enabled:
            model = torch.compile(model, **self.dynamo_plugin.compile_kwargs())
        self._models.append(model)
        return model

    def _prepare_deepspeed(self, objects: Any, kinds: List[Optional[str]]) -> Any:
        """DeepSpeed builds one engine from the model and its optimizer together, sized by the loader's batch."""
        models = [obj for obj, kind in zip(objects, kinds) if kind == "model"]
        optimizers = [obj for obj, kind in zip(objects, kinds) if kind == "optimizer"]
        if len(models) != 1 or len(optimizers) != 1 or self._deepspeed_engine is not None:
            raise ValueError(
                "under DeepSpeed, prepare exactly one model and its optimizer, in the same prepare() call (with "
                f"the training DataLoader); got {len(models)} model(s) and {len(optimizers)} optimizer(s)"
                + (" after an engine was already built" if self._deepspeed_engine is not None else "")
            )
        model, optimizer = models[0], optimizers[0]
        check_model_placement(model, self.device, f"DeepSpeed ZeRO-{self.deepspeed_plugin.zero_stage}")
        loaders = [obj for obj, kind in zip(objects, kinds) if kind == "data_loader"]
        micro_batch = getattr(loaders[0], "batch_size", None) if loaders else None
        if micro_batch is not None and self.split_batches:
            micro_batch //= self.num_processes
        config = filled_config(self.deepspeed_plugin, micro_batch=micro_batch, world=self.num_processes,
                               accumulation=self.gradient_accumulation_steps, mixed_precision=self._mixed_precision,
                               model=model)
        offloads_parameters = config["zero_optimization"].get("offload_param", {}).get("device", "none") != "none"
        if self.device_placement and not offloads_parameters:  # offloaded: DeepSpeed moves each where it belongs,
            model = model.to(self.device)                      # a model bigger than the GPU never goes there whole
        add_low_precision_forward(model, self._mixed_precision)  # DeepSpeed makes the weights bf16/fp16 itself
        engine = build_engine(model, optimizer, config)
        self._deepspeed_engine = engine
        self._trim_after_first_backward = True
        release_freed_memory()
        self._models.append(engine)
        wrapped = DeepSpeedOptimizer(optimizer, engine, self.gradient_state)
        stage = self.deepspeed_plugin.zero_stage
        wrapped.after_first_step = lambda: self._after_first_sharded_step(f"DeepSpeed ZeRO-{stage}", engine.module,
                                                                          optimizer, gradients=False)  # fmt: skip
        self._optimizers.append(wrapped)
        prepared = list(objects)
        for position, kind in enumerate(kinds):
            if kind == "model":
                prepared[position] = engine
            elif kind == "optimizer":
                prepared[position] = wrapped
        for kind in ("data_loader", "scheduler"):
            for position, obj in enumerate(objects):
                if kinds[position] == kind:
                    prepared[position] = getattr(self, f"prepare_{kind}")(obj)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _shard(self, model: torch.nn.Module, recorded: Optional[Dict[str, Optional[torch.Tensor]]]) -> None:
        """FSDP2 in place. Like DDP at construction, every rank starts from rank 0's weights first (each rank's own
        init may differ; a model from init_module was built from rank 0's random state, and only its buffers are
        sent); then an optimizer prepared earlier is pointed at the new parameters."""
        if self.num_processes == 1:
            one_rank_group(self.device)  # one process, CPU offload: FSDP2 still shards over a (one-rank) mesh
        with torch.no_grad():
            for tensor in list(model.buffers()) + (list(model.parameters()) if recorded is None else []):
                torch.distributed.broadcast(tensor, src=0)
        moved = shard_model(model, self.fsdp_plugin, self.device, self.num_processes, self._mixed_precision,
                            rows=recorded)  # fmt: skip
        self._moved_parameters.update(moved)
        for optimizer in self._optimizers:
            switch_parameters(optimizer.optimizer, moved)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          device_placement: Optional[bool] = None) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` (its state moves to its parameters' device, unless ``device_placement=False`` or the
        Accelerator's is False)."""
        with self._placement(device_placement):
            return self._prepare_optimizer(optimizer)

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        if self._moved_parameters:
            switch_parameters(optimizer, self._moved_parameters)
        if self.device_placement:
            move_state_to_params(optimizer)
        xla_world = self.num_processes if self.distributed_type == DistributedType.XLA else 0
        wrapped = AcceleratedOptimizer(optimizer, self.gradient_state, self.scaler, xla_world=xla_world)
        sharded = [model for model in self._models if is_sharded(model)]
        if sharded:
            wrapped.after_first_step = lambda: self._after_first_sharded_step("FSDP2", sharded[0], optimizer)
        self._watch_optimizer(wrapped)
        self._optimizers.append(wrapped)
        return wrapped

    def _after_first_sharded_step(self, how: str, model: torch.nn.Module, optimizer: Any, gradients: bool = True) -> None:
        """One line per rank, in its output on the dashboard: sharding at work (each rank about 1/N); and the
        memory the step's temporaries freed is given back, as after the first backward."""
        release_freed_memory()
        builtins.print(memory_line(how, self.num_processes, held_bytes(model, optimizer, gradients)), flush=True)

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: Optional[bool] = None,
                            slice_fn_for_dispatch: Any = None) -> PreparedDataLoader:
        """This rank's shard of ``data_loader``; see :mod:`notebook_accel.accelerator.data_loader`.

        ``device_placement``: overrides the Accelerator's for this loader. ``slice_fn_for_dispatch`` (HF's, for
        ``dispatch_batches``) is refused: every rank reads its own shard here."""
        if slice_fn_for_dispatch is not None:
            refuse("prepare_data_loader(slice_fn_for_dispatch=...)", "batches are never dispatched from rank 0 "
                   "(dispatch_batches is False): every rank reads its own shard, so there is nothing to slice")
        with self._placement(device_placement):
            return self._prepare_data_loader(data_loader)

    def _prepare_data_loader(self, data_loader: DataLoader) -> PreparedDataLoader:
        # The seedable sampler's seed: data_seed, else rank 0's initial seed (what set_seed / torch.manual_seed
        # chose), everywhere (HF takes each rank's own: the same wherever every rank was seeded alike).
        config = self.dataloader_config
        base_seed = operations.broadcast_object(torch.initial_seed() if config.data_seed is None else config.data_seed)
        if config.use_seedable_sampler:
            from .seedable import _with_seedable_sampler  # HF's SeedableRandomSampler

            data_loader = _with_seedable_sampler(data_loader, base_seed)
        on_xla = self.distributed_type == DistributedType.XLA
        prepared = prepare_data_loader(
            data_loader,
            process_index=self.process_index,
            num_processes=self.num_processes,
            device=self.device if self.device_placement and not on_xla else None,
            gradient_state=self.gradient_state,
            base_seed=base_seed,
            split_batches=self.split_batches,
            use_seedable_sampler=config.use_seedable_sampler,
        )
        for shard in (prepared.batch_sampler, prepared.sampler):
            if hasattr(shard, "even_batches"):
                shard.even_batches = config.even_batches
        prepared.non_blocking = config.non_blocking
        prepared.global_rng_types = tuple(self.rng_types)
        self._data_loaders.append(prepared)
        if on_xla and self.device_placement:
            return XlaDeviceLoader(prepared, self.device)  # type: ignore[return-value]
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap an LR scheduler so it steps with real optimizer steps, ``num_processes`` times each (as HF)."""
        target = scheduler.optimizer
        optimizers = [opt for opt in self._optimizers if target is opt or target is opt.optimizer]
        wrapped = AcceleratedScheduler(
            scheduler, optimizers, self.gradient_state, step_with_optimizer=self.step_scheduler_with_optimizer,
            num_processes=self.num_processes, split_batches=self.split_batches,
            adjust_scheduler=self.gradient_accumulation_plugin.adjust_scheduler,
        )
        self._schedulers.append(wrapped)
        return wrapped

    # -------------------------------------------------------------------------------------- training step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided for gradient accumulation and scaled for fp16.

        Example::

            loss = criterion(model(x), y)
            accelerator.backward(loss)      # instead of loss.backward()
        """
        if self._deepspeed_engine is not None:
            # the engine divides by its accumulation steps and reduces (ZeRO) on the boundary we tell it
            self._deepspeed_engine.set_gradient_accumulation_boundary(self.sync_gradients)
            self._deepspeed_engine.backward(loss, **kwargs)
        else:
            if self.gradient_accumulation_steps > 1:
                loss = loss / self.gradient_accumulation_steps
            if self.scaler is not None:
                loss = self.scaler.scale(loss)
            loss.backward(**kwargs)
        if self._trim_after_first_backward:  # sharded: the gathered layers it freed, before the optimizer state comes
            self._trim_after_first_backward = False
            release_freed_memory()

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-batch of gradient accumulation; put the whole step (through zero_grad) inside.

        Every ``gradient_accumulation_steps``-th block (and the last batch of a prepared loader) is a
        sync step: DDP all-reduces and the optimizer steps. On the others, DDP skips its all-reduce
        (``no_sync``) and ``optimizer.step()``/``zero_grad()``/``scheduler.step()`` do nothing.

        Example::

            accelerator = Accelerator(gradient_accumulation_steps=4)
            for x, y in loader:
                with accelerator.accumulate(model):
                    accelerator.backward(loss_fn(model(x), y))
                    optimizer.step()
                    optimizer.zero_grad()
        """
        if self.gradient_state.end_of_dataloader and self.gradient_accumulation_plugin.sync_with_dataloader:
            self._accumulation_count = 0  # an epoch boundary closes the cycle; the next one starts fresh
            sync = True
        else:
            self._accumulation_count += 1
            sync = self._accumulation_count % self.gradient_accumulation_steps == 0
        self.gradient_state.sync_gradients = sync
        with contextlib.ExitStack() as stack:
            # sync_each_batch: all-reduce every micro-batch (no gradients held unreduced between them)
            if not sync and self.num_processes > 1 and not self.gradient_accumulation_plugin.sync_each_batch:
                for model in models:
                    if isinstance(model, DistributedDataParallel):
                        stack.enter_context(model.no_sync())
                    elif is_sharded(model):  # FSDP2: keep unsharded gradients, reduce-scatter on the sync step
                        model.set_requires_gradient_sync(False)
                        stack.callback(model.set_requires_gradient_sync, True)
            yield

    def _unscale_gradients(self) -> None:
        for optimizer in self._optimizers:
            optimizer.unscale_gradients()

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16-scaled gradients by the loss scale (before looking at or clipping them yourself); a no-op
        without fp16. ``optimizer``: a prepared optimizer or a list of them (default: all)."""
        chosen = self._optimizers if optimizer is None else optimizer if isinstance(optimizer, (list, tuple)) \
            else [optimizer]  # fmt: skip
        for wrapped in chosen:
            if isinstance(wrapped, AcceleratedOptimizer):
                wrapped.unscale_gradients()

    def _reduce_xla_gradients(self) -> None:
        """On XLA, clip what every device agrees on: the averaged gradients, not this device's own."""
        for optimizer in self._optimizers:
            optimizer.reduce_gradients()

    def clip_grad_norm_(
        self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float, norm_type: float = 2.0
    ) -> Optional[torch.Tensor]:
        """Clip the (unscaled) gradient norm; returns the total norm before clipping.

        On accumulation steps it clips what is there, as HF accelerate does: the partial sum of this rank's
        gradients so far (under DDP's no_sync they differ per rank), so the same loop gives HF's weights. With
        fp16 the partial gradients stay scaled (they are unscaled once, on the sync step): the clip is done in
        the scaled units, the same numbers, and the norm returned unscaled.
        """
        if self._deepspeed_engine is not None:
            return self._deepspeed_clips(max_norm, norm_type)
        if not self.sync_gradients:
            return self._clip_partial_gradients(parameters, max_norm, norm_type)
        self._unscale_gradients()
        self._reduce_xla_gradients()
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        # over FSDP2's sharded gradients the norm is a DTensor: the same number on every rank, as a plain tensor
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def _clip_partial_gradients(
        self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        scale = self.scaler.get_scale() if self.scaler is not None and self.scaler.is_enabled() else 1.0
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm * scale, norm_type=norm_type) / scale
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def _deepspeed_clips(self, max_norm: float, norm_type: float) -> None:
        """DeepSpeed clips inside its step, to the norm fixed when the engine was built: check it is this one."""
        configured = self._deepspeed_engine.gradient_clipping()
        if norm_type != 2.0 or not configured or abs(configured - max_norm) > 1e-12 * max(1.0, max_norm):
            raise ValueError(
                f"clip_grad_norm_(max_norm={max_norm}) under DeepSpeed: DeepSpeed clips the L2 norm inside its "
                f"optimizer step, to the value fixed when the engine was built (now {configured or 'none'}); pass "
                f"DeepSpeedPlugin(gradient_clipping={max_norm})"
            )
        return None  # the norm is known only inside the step (engine.get_global_grad_norm() after it)

    def clip_grad_value_(self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]], clip_value: float) -> None:
        """Clamp every (unscaled) gradient to [-clip_value, clip_value]; on accumulation steps the partial gradients,
        as HF accelerate does (in fp16's scaled units there, as :meth:`clip_grad_norm_`)."""
        if not self.sync_gradients:
            scale = self.scaler.get_scale() if self.scaler is not None and self.scaler.is_enabled() else 1.0
            torch.nn.utils.clip_grad_value_(parameters, clip_value * scale)
            return
        self._unscale_gradients()
        self._reduce_xla_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None, *, enabled: bool = True) -> ContextManager[Any]:
        """Autocast for code outside a prepared model's forward (fp16 on CUDA, bf16 on CPU/CUDA/TPU).

        Prepared models already run their forward under it; this is for extra computations.
        ``autocast_handler`` (an ``AutocastKwargs``, default the Accelerator's) can turn it off.
        """
        handler = autocast_handler if isinstance(autocast_handler, AutocastKwargs) else self.autocast_handler
        if isinstance(autocast_handler, bool):  # the old positional `enabled`
            enabled = autocast_handler
        if handler is not None:
            enabled = enabled and handler.enabled
        return autocast_context(self.device, self._mixed_precision, enabled=enabled)

    @contextlib.contextmanager
    def profile(self, profile_handler: Optional[ProfileKwargs] = None) -> Iterator[Any]:
        """``torch.profiler`` over the block, as a ``ProfileKwargs`` describes it (default: the Accelerator's, else
        CPU and CUDA activity); with its ``output_trace_dir`` every rank writes ``profile_<rank>.json`` there.

        Example::

            with accelerator.profile(ProfileKwargs(output_trace_dir="traces")) as prof:
                train_a_few_steps()
            print(prof.key_averages().table(row_limit=5))
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{self.process_index}.json"))
        self.wait_for_everyone()

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """An iterable over the rest of ``dataloader``'s next epoch, without its first ``num_batches`` steps (to resume
        mid-epoch after ``load_state``); later epochs iterate ``dataloader`` itself, in full.

        Example::

            accelerator.load_state("ckpt")                      # saved 30 steps into epoch 2
            for batch in accelerator.skip_first_batches(train_loader, 30): ...
        """
        return SkippedLoader(dataloader, num_batches)

    # ---------------------------------------------------------------------------------------- collectives
    def gather(self, tensor: Tree) -> Tree:
        """Every rank's tensors, concatenated along dim 0 in rank order (0-dim tensors count as 1 row).

        Example::

            losses = accelerator.gather(loss.detach())      # shape [num_processes]
        """
        return op_checker.gather(tensor)

    def gather_for_metrics(self, input_data: Tree, use_gather_object: bool = False) -> Tree:
        """Like :meth:`gather`, minus the samples that only pad the last step: call it once per eval batch.

        Over one pass of a prepared loader the results concatenate to exactly ``len(dataset)`` items, in
        the order a single process would see them. Python objects (e.g. lists of strings) work too.

        Example::

            for x, y in eval_loader:
                preds, refs = accelerator.gather_for_metrics((model(x).argmax(-1), y))
                correct += (preds == refs).sum().item(); total += len(refs)   # total == len(dataset)
        """
        tree = input_data
        layout = self.gradient_state.current_layout
        leaves = operations.tree_leaves(tree)
        if use_gather_object and operations.is_tensor(tree):  # HF gathers a tensor's rows as objects
            return self._gather_objects_for_metrics(list(tree), layout)
        if use_gather_object or not leaves or any(not operations.is_tensor(leaf) for _, leaf in leaves):
            return self._gather_objects_for_metrics(tree, layout)
        _, per_rank = operations.gather_per_rank(tree)
        if layout is None or not layout.has_padding or len(layout.real) != self.num_processes:
            return operations.fill_leaves(tree, [torch.cat(chunks) for chunks in per_rank])
        trimmed = []
        for chunks in per_rank:
            kept = [self._keep_real(chunk, rank, layout) for rank, chunk in enumerate(chunks)]
            trimmed.append(torch.cat(kept))
        return operations.fill_leaves(tree, trimmed)

    @staticmethod
    def _keep_real(rows: Any, rank: int, layout: Any) -> Any:
        """A rank's contribution minus padding: rows beyond ``real`` if it is per-sample, else all or none."""
        size, real = layout.sizes[rank], layout.real[rank]
        if size is not None and len(rows) == size:
            return rows[:real]
        return rows if real > 0 else rows[:0]

    def _gather_objects_for_metrics(self, obj: Any, layout: Any) -> List[Any]:
        everyone = operations.gather_object(obj)
        result: List[Any] = []
        for rank, contribution in enumerate(everyone):
            if layout is not None and layout.has_padding and isinstance(contribution, (list, tuple)):
                result.extend(self._keep_real(list(contribution), rank, layout))
            elif isinstance(contribution, (list, tuple)):
                result.extend(contribution)
            elif layout is None or not layout.has_padding or layout.real[rank] > 0:
                result.append(contribution)
        return result

    def reduce(self, tensor: Tree, reduction: str = "sum", scale: float = 1.0) -> Tree:
        """Every tensor reduced over the ranks ("sum", "mean", "max" or "min"), times ``scale``; inputs unchanged."""
        reduced = op_checker.reduce(tensor, reduction)
        return reduced if scale == 1.0 else operations.tree_map(lambda tensor: tensor * scale, reduced)

    def pad_across_processes(self, tensor: Tree, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Tree:
        """Pad tensors along ``dim`` to the largest size on any rank (e.g. generated sequences)."""
        return op_checker.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def wait_for_everyone(self) -> None:
        """A barrier: returns once every rank has called it."""
        operations.barrier()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. to download or preprocess), the others after it.

        Example::

            with accelerator.main_process_first():
                dataset = load_or_build_cache()
        """
        if not self.is_main_process:
            self.wait_for_everyone()
        try:
            yield
        finally:
            if self.is_main_process:
                self.wait_for_everyone()

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Like :meth:`main_process_first`, per node."""
        if not self.is_local_main_process:
            self.wait_for_everyone()
        try:
            yield
        finally:
            if self.is_local_main_process:
                self.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main_process:
            builtins.print(*args, **kwargs)

    # ------------------------------------------------------------------------------------ models and files
    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = False,
                     *, keep_autocast: Optional[bool] = None) -> torch.nn.Module:
        """The user's own module inside DDP (and ``torch.compile``) wrappers.

        ``keep_fp32_wrapper=False`` (ours also says ``keep_autocast=False``) also removes the mixed-precision
        forward that ``prepare`` added, in place (the prepared model then runs in full precision too).
        ``keep_torch_compile=True`` stops at a compiled module (HF's default; ours unwraps it, so that
        ``unwrap_model(model).state_dict()`` has the user's keys, without ``_orig_mod.``).
        """
        keep_autocast = keep_fp32_wrapper if keep_autocast is None else keep_autocast
        while True:
            if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)) or is_engine(model):
                model = model.module
            elif not keep_torch_compile and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
                model = model._orig_mod
            else:
                break
        if not keep_autocast:
            remove_autocast_from_forward(model)
        return model

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> Dict[str, torch.Tensor]:
        """The model's full weights (call on every rank under FSDP2: rank 0 gets them as CPU tensors, gathered
        from every rank's shards, the others an empty dict; otherwise this rank's own ``state_dict()``).

        Example::

            return accelerator.get_state_dict(model)      # notebook_launcher returns rank 0's: the full model
        """
        if is_sharded(model):
            return full_state_dict(model)
        if is_engine(model):
            return engine_state_dict(model)
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def save_model(self, model: torch.nn.Module, save_directory: Union[str, os.PathLike],
                   max_shard_size: Union[int, str] = "10GB", safe_serialization: bool = True) -> str:
        """The model's full weights in ``save_directory``, in HF's files (call on every rank: under FSDP2 and
        ZeRO-3 the weights are gathered first; rank 0 writes): ``model.safetensors`` (needs the safetensors
        package), or ``pytorch_model.bin`` with ``safe_serialization=False``; beyond ``max_shard_size`` (bytes, or
        ``"10GB"``, ``"500MB"``...) shards ``model-00001-of-00002.safetensors``... and
        ``model.safetensors.index.json``, as HF names them. Returns the file's path (the index's when sharded).

        Example::

            accelerator.save_model(model, "final")     # load anywhere: safetensors.torch.load_file(...)
        """
        weights = self.get_state_dict(model)
        path = ""
        if self.is_main_process:
            os.makedirs(save_directory, exist_ok=True)
            path = save_sharded_weights(weights, str(save_directory), max_shard_size, safe_serialization)
        return operations.broadcast_object(path)  # every rank returns once it is written

    def load_model(self, model: torch.nn.Module, path: str, strict: bool = True) -> None:
        """Full weights from ``path`` into ``model`` (prepared or not; call it on every rank): what
        :meth:`save_model` wrote (its directory or its file), any ``.safetensors`` / ``torch.save`` file of a state
        dict, a Hugging Face directory with ``model.safetensors.index.json``, or the ``model.dcp`` of
        :meth:`save_state`. Under FSDP2 and ZeRO-3 rank 0 reads the file, once, and sends it one tensor at a time:
        every other rank keeps only its shards, so none holds the whole model (torch.distributed.checkpoint's
        ``model.dcp``: each rank reads its own shards). With DDP or one process every rank reads it.

        Example::

            with accelerator.init_module(empty_init=True):     # no time spent on weights about to be replaced
                model = MyModel()
            model, optimizer = accelerator.prepare(model, optimizer)
            accelerator.load_model(model, "pretrained/")       # rank 0 reads; each rank keeps its shards
        """
        load_model_weights(model, path, strict=strict)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` (safetensors with ``safe_serialization=True``) on the main process, once per machine with
        ``ProjectConfiguration(save_on_each_node=True)``; as in HF the other ranks write nothing and do not wait
        (so it may be called on the main process alone).

        Example::

            accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
        """
        save(obj, f, save_on_each_node=self.project_configuration.save_on_each_node,
             safe_serialization=safe_serialization)  # fmt: skip

    def save_state(self, output_dir: Optional[Union[str, os.PathLike]] = None, safe_serialization: bool = True,
                   **save_model_func_kwargs: Any) -> Path:
        """Save models, optimizers, schedulers, the fp16 scaler, every rank's RNG and data-loader position, and the
        objects of :meth:`register_for_checkpointing` (call on all ranks), in HF accelerate's files
        (``model.safetensors`` or, with ``safe_serialization=False``, ``pytorch_model.bin``; ``optimizer.bin``,
        ``scheduler.bin``, ``random_states_<rank>.pkl``: see :mod:`.checkpointing`), so HF can resume from it.
        Returns the directory, a ``pathlib.Path`` as in HF. ``save_model_func_kwargs`` are HF's for DeepSpeed's
        ``save_checkpoint``: accepted, unused.

        With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` leave ``output_dir`` out: it is
        ``<project_dir>/checkpoints/checkpoint_<i>``, counting up, the oldest removed beyond ``total_limit``.
        Hooks of :meth:`register_save_state_pre_hook` run first.

        Example::

            accelerator.save_state("checkpoints/epoch_3")
            ...
            accelerator.load_state("checkpoints/epoch_3")   # after prepare(), with the same objects
        """
        directory = self._directory_to_save(None if output_dir is None else str(output_dir))
        if self._save_state_pre_hooks:
            weights = [self.get_state_dict(model, unwrap=False) for model in self._models]
            for hook in self._save_state_pre_hooks.values():
                hook(self._models, weights, directory)
        save_checkpoint(directory, **self._checkpointed(), process_index=self.process_index,
                        safe_serialization=safe_serialization, step=self._accumulation_count,
                        optimizer_steps=self.optimizer_steps)  # fmt: skip
        self._save_custom_objects(directory, self.process_index)
        self._time_limit.saved = self._time_limit.should_checkpoint  # the user saved at the warning: not us again
        self.project_configuration.iteration += 1
        self.wait_for_everyone()
        return Path(directory)

    def load_state(self, input_dir: Optional[Union[str, os.PathLike]] = None, load_kwargs: Optional[Dict[str, Any]]
                   = None, **load_model_func_kwargs: Any) -> None:
        """Restore what :meth:`save_state` — ours or HF accelerate's — wrote into the prepared objects (call on all
        ranks). Without ``input_dir``, under automatic checkpoint naming: the latest ``checkpoints/checkpoint_<i>``.
        ``load_model_func_kwargs`` go to the models' ``load_state_dict`` (``strict=False``), as in HF;
        ``load_kwargs`` (HF's, for ``torch.load``) and ``map_location`` are accepted: everything loads to the CPU
        first and is copied into the prepared objects where they are."""
        directory = self._directory_to_load(None if input_dir is None else str(input_dir))
        for hook in self._load_state_pre_hooks.values():
            hook(self._models, directory)
        load_model_func_kwargs.pop("map_location", None)
        override = load_checkpoint(directory, **self._checkpointed(), process_index=self.process_index,
                                   load_model_kwargs=load_model_func_kwargs)  # fmt: skip
        if "step" in override:
            self._accumulation_count = override["step"]
        self._time_limit.steps = override.get("optimizer_steps", self._time_limit.steps)
        self._load_custom_objects(directory)
        if input_dir is None:  # the next automatic checkpoint follows the one resumed (HF would reuse its number)
            self.project_configuration.iteration = max(self.project_configuration.iteration,
                                                       checkpoint_number(directory) + 1)

    def _checkpointed(self) -> Dict[str, Any]:
        return dict(
            models=[model if is_engine(model) else self.unwrap_model(model) for model in self._models],
            optimizers=self._optimizers,
            schedulers=self._schedulers,
            scaler=self.scaler,
            loaders=self._data_loaders,
        )

    def set_seed(self, seed: int, device_specific: bool = False) -> int:
        """Seed python, numpy and torch on this rank (``device_specific`` adds the rank); returns the seed."""
        return _set_seed(seed, device_specific=device_specific, process_index=self.process_index)

    # ---------------------------------------------------------------------------------------------- the end
    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` (or a submodule) was spread over devices by a ``device_map`` (big-model inference):
        such a model cannot be trained with DDP."""
        return any(len(set(getattr(module, "hf_device_map", {}).values())) > 1 for module in model.modules())

    def clear(self, *objects: Any) -> List[Any]:
        """Same as :meth:`free_memory`."""
        return self.free_memory(*objects)

    def free_memory(self, *objects: Any) -> List[Any]:
        """Forget every prepared object (so their memory can be freed) and empty the CUDA cache; returns
        ``[None] * len(objects)`` for ``model, optimizer = accelerator.free_memory(model, optimizer)``."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._data_loaders.clear()
        self._deepspeed_engine = None
        self.gradient_state.active_loaders.clear()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return [None for _ in objects]

    def end_training(self) -> None:
        """Close the trackers' runs, wait for every rank, free memory and destroy the process group (kept, as by
        HF's, where ``FORK_LAUNCHED`` is set: :meth:`PartialState.destroy_process_group`)."""
        self._finish_trackers()
        self.wait_for_everyone()
        self.free_memory()
        self.state.destroy_process_group()
