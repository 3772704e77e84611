"""The seeds' four-line API on torch.distributed: ``Accelerator()``, ``prepare``, ``backward``, ``gather``.

One module per job (every module of this package is listed here; a test checks it against the files, and the
``Accelerator`` docstring maps each of its members to the module that defines it):

- :mod:`.state`         rank, world and device from the launch environment; the process group
- :mod:`.precision`     "no" / "fp16" / "bf16": autocast, GradScaler, fp32 outputs
- :mod:`.operations`    nested batches: to device, gather, reduce, pad, broadcast
- :mod:`.sharding`      splitting a sampler or an IterableDataset between ranks, with padded tails
- :mod:`.data_loader`   the prepared DataLoader: shard + synchronized shuffling + device placement
- :mod:`.dispatch`      ``dispatch_batches=True``: rank 0 reads the DataLoader, every rank gets its slice of a step
- :mod:`.seedable`      HF's SeedableRandomSampler (``use_seedable_sampler=True``): reseeded seed + epoch each pass
- :mod:`.fsdp`          FSDP2 sharding (``fully_shard``) and full/sharded state dicts
- :mod:`.zero`          DeepSpeed ZeRO: the plugin, the filled config, the engine's optimizer
- :mod:`.optimizer`     optimizer wrapper: loss scaling, accumulation steps
- :mod:`.scheduler`     scheduler wrapper: with real optimizer steps, num_processes times each (as HF)
- :mod:`.rng`           seeding, RNG snapshots, the RNG stream all ranks share for data order
- :mod:`.checkpointing` save_state / load_state
- :mod:`.full_state`    full (unsharded) weights and optimizer state by parameter name, into any prepared model
- :mod:`.zero_checkpoint` a DeepSpeed checkpoint as full state, for another number of ranks
- :mod:`.placement`     where a model must be before FSDP2 or DeepSpeed shards it (whole, CPU or this rank's device)
- :mod:`.sharded_init`  ``init_module()`` under FSDP2: a model built without any rank holding it whole
- :mod:`.memory`        what a rank holds of a sharded model (parameters, gradients, optimizer state), in bytes
- :mod:`.gradient_state` the per-step state the accelerator, its optimizers, schedulers and loaders share
- :mod:`.configs`       HF accelerate's ``*Kwargs`` / ``*Plugin`` / ``*Configuration`` classes and enums
- :mod:`.partial_state` ``PartialState`` / ``AcceleratorState`` (HF's names for this rank's place)
- :mod:`.process_control` split_between_processes, the on_* decorators, triggers, no_sync, join_uneven_inputs
- :mod:`.project`       project_dir, automatic checkpoint naming, registered objects, save/load hooks
- :mod:`.time_limit`    the warning before a time limit (SIGUSR2), agreed by every rank; the checkpoint made then
- :mod:`.tracking`      log_with: TensorBoard, W&B, MLflow, GeneralTracker; ``log`` also feeds the dashboard
- :mod:`.op_checker`    debug mode (``ACCELERATE_DEBUG_MODE``): collectives check the ranks' shapes first
- :mod:`.absent`        HF members we do not offer, each raising NotImplementedError with what to use instead
- :mod:`.utilities`     the rest of what HF code imports from ``accelerate.utils`` (see :mod:`notebook_accel.utils`)
- :mod:`.accelerator`   the :class:`Accelerator` that ties them together
"""
from .accelerator import Accelerator
from .configs import (  # HF code imports these from accelerate.accelerator too
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from .data_loader import PreparedDataLoader
from .fsdp import FullyShardedDataParallelPlugin
from .optimizer import AcceleratedOptimizer
from .partial_state import AcceleratorState, PartialState
from .rng import set_seed
from .scheduler import AcceleratedScheduler
from .state import DistributedType
from .tracking import GeneralTracker
from .zero import DeepSpeedPlugin

__all__ = [
    "Accelerator",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "AcceleratorState",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GeneralTracker",
    "GradientAccumulationPlugin",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "PartialState",
    "PreparedDataLoader",
    "ProfileKwargs",
    "ProjectConfiguration",
    "set_seed",
]
