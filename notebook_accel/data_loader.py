"""``accelerate.data_loader``: ``prepare_data_loader`` (HF's parameters), ``skip_first_batches`` and
``SeedableRandomSampler``, on our sharded loader (:mod:`notebook_accel.accelerator.data_loader`)."""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

import torch
from torch.utils.data import DataLoader

from .accelerator import data_loader as _ours
from .accelerator import operations
from .accelerator.absent import refuse_name
from .accelerator.data_loader import PreparedDataLoader, SkippedLoader
from .accelerator.dispatch import DispatchedDataLoader
from .accelerator.gradient_state import GradientState
from .accelerator.seedable import SeedableRandomSampler, _with_seedable_sampler

__all__ = ["DataLoaderDispatcher", "DataLoaderShard", "SeedableRandomSampler", "SkipDataLoader", "prepare_data_loader", "skip_first_batches"]

DataLoaderShard = PreparedDataLoader  # HF's name for a prepared loader (isinstance checks)
DataLoaderDispatcher = DispatchedDataLoader  # HF's name for a loader rank 0 reads for everyone
SkipDataLoader = SkippedLoader


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """One epoch of ``dataloader`` (a prepared one) without its first ``num_batches`` batches (resume mid-epoch)."""
    return SkippedLoader(dataloader, num_batches)


def prepare_data_loader(dataloader: DataLoader, device: Optional[torch.device] = None,
                        num_processes: Optional[int] = None, process_index: Optional[int] = None,
                        split_batches: bool = False, put_on_device: bool = False,
                        rng_types: Optional[List[Union[str, Any]]] = None, dispatch_batches: Optional[bool] = None,
                        even_batches: bool = True, slice_fn_for_dispatch: Optional[Callable[..., Any]] = None,
                        use_seedable_sampler: bool = False, data_seed: Optional[int] = None,
                        non_blocking: bool = False, use_stateful_dataloader: bool = False,
                        torch_device_mesh: Any = None) -> Union[PreparedDataLoader, DispatchedDataLoader]:  # fmt: skip
    """This rank's shard of ``dataloader`` without an Accelerator (HF's function): ``num_processes`` /
    ``process_index`` default to the launch's, batches move to ``device`` with ``put_on_device``. The shuffling is
    HF's and always synchronized between the ranks ("generator" is always on; ``rng_types``' "torch" / "cuda" give
    every rank rank 0's global RNG state at each iteration's start, as on HF): by default
    a shuffling sampler's generator is seeded once here from a draw on the global torch RNG and each iteration
    starts from rank 0's state of it; ``use_seedable_sampler`` makes a plain ``RandomSampler`` a
    :class:`SeedableRandomSampler` seeded ``data_seed`` (else rank 0's torch seed) + the epoch, as HF does. ``dispatch_batches=True``: rank 0 alone reads the loader and sends each rank its slice of
    every step (:class:`~notebook_accel.accelerator.dispatch.DispatchedDataLoader`, HF's ``DataLoaderDispatcher``)."""
    from .accelerator.partial_state import PartialState

    for name, given, why in (
            ("slice_fn_for_dispatch", slice_fn_for_dispatch, "a dispatched step is sliced along its first dimension"),
            ("use_stateful_dataloader=True", use_stateful_dataloader, "torchdata's StatefulDataLoader is not offered; "
                                                                      "resume mid-epoch with skip_first_batches"),
            ("torch_device_mesh", torch_device_mesh, "device meshes (tensor/context parallelism) are not offered")):
        if given:
            refuse_name(f"prepare_data_loader({name})", why)
    state = PartialState()
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    if device is None:
        device = state.device
    if dispatch_batches:
        return DispatchedDataLoader(dataloader, process_index=process_index, num_processes=num_processes,
                                    split_batches=split_batches, even_batches=even_batches,
                                    device=device if put_on_device else None, gradient_state=GradientState())
    base_seed = operations.broadcast_object(torch.initial_seed()) if data_seed is None else data_seed
    if use_seedable_sampler:
        dataloader = _with_seedable_sampler(dataloader, base_seed)
    prepared = _ours.prepare_data_loader(dataloader, process_index=process_index, num_processes=num_processes,
                                         device=device if put_on_device else None, gradient_state=GradientState(),
                                         base_seed=base_seed, split_batches=split_batches,
                                         use_seedable_sampler=use_seedable_sampler)  # fmt: skip
    for shard in (prepared.batch_sampler, prepared.sampler):
        if hasattr(shard, "even_batches"):
            shard.even_batches = even_batches
    prepared.non_blocking = non_blocking
    prepared.global_rng_types = tuple(str(getattr(kind, "value", kind)) for kind in rng_types or ())
    return prepared
