"""The seeds' four-line API on torch.distributed: ``Accelerator()``, ``prepare``, ``backward``, ``gather``.

One module per job:

- :mod:`.state`         rank, world and device from the launch environment; the process group
- :mod:`.precision`     "no" / "fp16" / "bf16": autocast, GradScaler, fp32 outputs
- :mod:`.operations`    nested batches: to device, gather, reduce, pad, broadcast
- :mod:`.sharding`      splitting a sampler or an IterableDataset between ranks, with padded tails
- :mod:`.data_loader`   the prepared DataLoader: shard + synchronized shuffling + device placement
- :mod:`.fsdp`          FSDP2 sharding (``fully_shard``) and full/sharded state dicts
- :mod:`.zero`          DeepSpeed ZeRO: the plugin, the filled config, the engine's optimizer
- :mod:`.optimizer`     optimizer wrapper: loss scaling, accumulation steps
- :mod:`.scheduler`     scheduler wrapper: once per real optimizer step
- :mod:`.rng`           seeding, RNG snapshots, the RNG stream all ranks share for data order
- :mod:`.checkpointing` save_state / load_state
- :mod:`.accelerator`   the :class:`Accelerator` that ties them together
"""
from .accelerator import Accelerator
from .data_loader import PreparedDataLoader
from .fsdp import FullyShardedDataParallelPlugin
from .optimizer import AcceleratedOptimizer
from .rng import set_seed
from .scheduler import AcceleratedScheduler
from .state import DistributedType
from .zero import DeepSpeedPlugin

__all__ = [
    "Accelerator",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "DeepSpeedPlugin",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "PreparedDataLoader",
    "set_seed",
]
