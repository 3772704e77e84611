"""``prepare(data_loader)``: this rank's shard of a DataLoader, with batches already on the device.

The prepared loader is a real :class:`torch.utils.data.DataLoader` (same dataset, workers, collate_fn,
pin_memory...), built around a :class:`~.sharding.BatchSamplerShard` (map-style datasets) or an
:class:`~.sharding.IterableDatasetShard`. On top of a plain DataLoader it:

- makes the data order identical on every rank (see :class:`EpochRandomness`) and different each epoch
  (``set_epoch``, or automatically), so the shards never overlap;
- looks one batch ahead, to know when the current batch is the last one (gradient accumulation syncs
  there);
- remembers each step's :class:`~.sharding.StepLayout` for ``gather_for_metrics``;
- moves every batch to the device (tensors in dicts, lists, tuples, namedtuples).
"""
from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from .gradient_state import GradientState
from .operations import broadcast, send_to_device
from .rng import SharedRNG, epoch_seed
from .sharding import BatchSamplerShard, IterableDatasetShard, Randomness, StepLayout, TaggedCollate

__all__ = ["PreparedDataLoader", "EpochRandomness", "prepare_data_loader", "SkippedLoader"]

# Samplers whose only randomness is their `generator` attribute (when it is None they draw a seed from
# torch's global RNG). Their subclasses may override __iter__, so they get the shared RNG as well.
_GENERATOR_ONLY_SAMPLERS = (RandomSampler, WeightedRandomSampler, SubsetRandomSampler)

_END = object()


class EpochRandomness(Randomness):
    """Makes a sampler's (or an IterableDataset's) random draws identical on every rank, per epoch.

    Two mechanisms, chosen per sampler at prepare time:

    - ``owned_generator``: a sampler with an unset ``generator`` (``RandomSampler()``,
      ``DataLoader(shuffle=True)``, ``WeightedRandomSampler``) gets one of ours, reseeded each epoch
      (for an IterableDataset: its own ``generator``, when it has one and no ``set_epoch``);
    - ``shared_stream``: any other sampler runs under a :class:`~.rng.SharedRNG` (torch + python global
      RNG, swapped in only around its own calls), reseeded each epoch.

    Both are seeded with ``base_seed + epoch``; ``base_seed`` is rank 0's ``torch.initial_seed()``, so
    ``set_seed``/``torch.manual_seed`` before ``prepare`` makes the order reproducible across runs and the
    same for 1 or N processes.
    """

    def __init__(self, base_seed: int, owned_generator: Optional[torch.Generator], shared_stream: bool) -> None:
        self.base_seed = base_seed
        self.owned_generator = owned_generator
        self.shared_stream = shared_stream
        self._shared: Optional[SharedRNG] = None

    def begin_epoch(self, epoch: int) -> None:
        seed = epoch_seed(self.base_seed, epoch)
        if self.owned_generator is not None:
            self.owned_generator.manual_seed(seed)
        self._shared = SharedRNG(seed) if self.shared_stream else None

    def iterate(self, iterable: Any) -> Iterator[Any]:
        return self._shared.iterate(iterable) if self._shared is not None else iter(iterable)


def _share_user_generator(generator: torch.Generator) -> None:
    """A generator the user passed in: give every rank rank 0's state (a no-op for one process)."""
    generator.set_state(broadcast(generator.get_state()))


def _plan_sampler(sampler: Any) -> Tuple[Any, Optional[torch.Generator], bool]:
    """Returns ``(sampler to use, generator we own or None, needs the shared stream)``."""
    if type(sampler) is SequentialSampler:
        return sampler, None, False
    owned = None
    generator = getattr(sampler, "generator", False)
    if generator is None:
        sampler = copy.copy(sampler)  # leave the user's DataLoader untouched
        owned = sampler.generator = torch.Generator()
    elif isinstance(generator, torch.Generator):
        _share_user_generator(generator)
    return sampler, owned, type(sampler) not in _GENERATOR_ONLY_SAMPLERS


def _plan_batch_sampler(batch_sampler: Any) -> Tuple[Any, Optional[torch.Generator], bool]:
    if type(batch_sampler) is BatchSampler:
        sampler, owned, shared = _plan_sampler(batch_sampler.sampler)
        if sampler is not batch_sampler.sampler:
            batch_sampler = copy.copy(batch_sampler)
            batch_sampler.sampler = sampler
        return batch_sampler, owned, shared
    return batch_sampler, None, True  # a custom batch sampler: whatever it draws, it draws in lockstep


_COPIED_SETTINGS = (
    "num_workers", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
    "prefetch_factor", "persistent_workers", "pin_memory_device",
)  # fmt: skip


def _loader_settings(loader: DataLoader) -> Dict[str, Any]:
    """The constructor settings of ``loader`` that the sharded copy keeps."""
    accepted = inspect.signature(DataLoader.__init__).parameters
    settings = {name: getattr(loader, name) for name in _COPIED_SETTINGS if name in accepted}
    if not settings.get("num_workers"):
        settings.pop("prefetch_factor", None)  # DataLoader refuses a prefetch_factor without workers
    if not settings.get("pin_memory_device"):
        settings.pop("pin_memory_device", None)
    if "in_order" in accepted:
        settings["in_order"] = True  # layouts are matched to batches by order
    return settings


class PreparedDataLoader(DataLoader):
    """A DataLoader that yields this rank's shard, on this rank's device.

    Extra attributes: ``total_batch_size`` (samples per optimizer step over all ranks, before
    accumulation), ``per_process_batch_size``, ``end_of_dataloader`` (the batch just yielded is the last),
    ``current_layout`` and ``epoch``. ``set_epoch(n)`` picks the shuffle of epoch ``n`` (it is also passed
    on to the sampler and dataset when they have a ``set_epoch``); without it every new iteration moves
    to the next epoch.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        gradient_state: GradientState,
        device: Optional[torch.device],
        randomness: Optional[EpochRandomness] = None,
        tagged: bool = False,
        per_process_batch_size: Optional[int] = None,
        total_batch_size: Optional[int] = None,
        **dataloader_kwargs: Any,
    ) -> None:
        super().__init__(dataset, **dataloader_kwargs)
        self.gradient_state = gradient_state
        self.device = device
        self.randomness = randomness
        self.tagged = tagged
        self.per_process_batch_size = per_process_batch_size
        self.total_batch_size = total_batch_size
        self.end_of_dataloader = False
        self.current_layout: Optional[StepLayout] = None
        self.epoch = 0  # the epoch of the current (or last) iteration
        self._next_epoch = 0
        self.non_blocking = False  # DataLoaderConfiguration(non_blocking=True): async copies even without pinning

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` for the next iteration (identical on every rank)."""
        self._next_epoch = epoch

    def _announce_epoch(self, epoch: int) -> None:
        """Pass the epoch on to whatever has a ``set_epoch`` (DistributedSampler, streaming datasets...)."""
        candidates = [self.dataset, self.sampler, self.batch_sampler]
        for shard in (self.batch_sampler, self.sampler):
            if isinstance(shard, BatchSamplerShard):
                candidates += [shard.batch_sampler, shard.sampler]
        announced: List[int] = []
        for candidate in candidates:
            if callable(getattr(candidate, "set_epoch", None)) and id(candidate) not in announced:
                candidate.set_epoch(epoch)
                announced.append(id(candidate))

    def _layout_queue(self) -> Optional[Any]:
        """Where the map-style shard queues each step's layout (None: tagged batches, or no shard)."""
        shard = self.batch_sampler if isinstance(self.batch_sampler, BatchSamplerShard) else self.sampler
        return getattr(shard, "layouts", None)

    def _receive(self, iterator: Iterator[Any], layouts: Optional[Any]) -> Any:
        """Next ``(batch, layout)`` from the underlying loader, or _END."""
        raw = next(iterator, _END)
        if raw is _END or self.tagged:
            return raw
        return raw, (layouts.popleft() if layouts else None)

    def __iter__(self) -> Iterator[Any]:
        self.end_of_dataloader = False
        self.gradient_state.loader_started(self)
        try:
            for batch, last, layout in self.steps():
                self.end_of_dataloader, self.current_layout = last, layout
                yield batch
        finally:
            self.gradient_state.loader_stopped(self)

    def steps(self, on_device: bool = True) -> Iterator[Tuple[Any, bool, Optional[StepLayout]]]:
        """One epoch of ``(batch, is_last, layout)``, without touching the gradient state: whoever hands the
        batches to the user records them (``__iter__`` here; on XLA the :class:`XlaDeviceLoader`, since
        torch_xla's loader takes them from here in its prefetch thread, ahead of the user).
        ``on_device=False`` leaves the batch where the DataLoader made it (torch_xla moves it)."""
        self.epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        if self.randomness is not None:
            self.randomness.begin_epoch(self.epoch)
        self._announce_epoch(self.epoch)
        non_blocking = bool((self.pin_memory or self.non_blocking) and self.device is not None
                            and self.device.type == "cuda")  # fmt: skip
        iterator = super().__iter__()
        layouts = self._layout_queue()
        upcoming = self._receive(iterator, layouts)
        while upcoming is not _END:
            batch, layout = upcoming
            # one batch of look-ahead: is the batch we are about to hand out the last one?
            upcoming = self._receive(iterator, layouts)
            if on_device and self.device is not None:
                batch = send_to_device(batch, self.device, non_blocking=non_blocking)
            yield batch, upcoming is _END, layout


class _XlaStep:
    """A batch's bookkeeping, travelling beside it through torch_xla's loader (which moves tensors, turns
    tuples into lists and passes other objects through as they are)."""

    __slots__ = ("last", "layout")

    def __init__(self, last: bool, layout: Optional[StepLayout]) -> None:
        self.last, self.layout = last, layout


class _XlaSteps:
    """What torch_xla's ``MpDeviceLoader`` iterates (in its prefetch thread): ``[batch, _XlaStep]`` pairs."""

    def __init__(self, prepared: PreparedDataLoader) -> None:
        self.prepared = prepared

    def __iter__(self) -> Iterator[Any]:
        for batch, last, layout in self.prepared.steps(on_device=False):
            yield [batch, _XlaStep(last, layout)]

    def __len__(self) -> int:
        return len(self.prepared)


class XlaDeviceLoader:
    """``prepare``'s loader on XLA: torch_xla's ``MpDeviceLoader`` over this rank's shard. It uploads the next
    batches to the device in a background thread and cuts the lazy graph once per step (what torch_xla asks
    of a training loop); everything else (``set_epoch``, ``end_of_dataloader``...) is the shard's.

    torch_xla's loader thread takes batches from the shard up to 24 ahead of the user, so ``end_of_dataloader``
    and the layout ``gather_for_metrics`` reads travel with each batch and are recorded here, as the user
    receives it: gradient accumulation syncs at the epoch's real last batch.

    Example::

        loader = accelerator.prepare(loader)      # on a TPU: an XlaDeviceLoader
        for inputs, targets in loader: ...        # tensors already on the XLA device
    """

    def __init__(self, prepared: PreparedDataLoader, device: torch.device) -> None:
        self.prepared = prepared
        self.device = device
        self.end_of_dataloader = False
        self.current_layout: Optional[StepLayout] = None

    def __iter__(self) -> Iterator[Any]:
        import torch_xla.distributed.parallel_loader as pl

        gradient_state = self.prepared.gradient_state
        self.end_of_dataloader = False
        gradient_state.loader_started(self)
        try:
            for batch, step in pl.MpDeviceLoader(_XlaSteps(self.prepared), self.device):
                self.end_of_dataloader, self.current_layout = step.last, step.layout
                yield batch
        finally:
            gradient_state.loader_stopped(self)

    def __len__(self) -> int:
        return len(self.prepared)

    def __getattr__(self, name: str) -> Any:
        if name == "prepared":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.prepared, name)


def prepare_data_loader(
    loader: DataLoader,
    *,
    process_index: int,
    num_processes: int,
    device: Optional[torch.device],
    gradient_state: GradientState,
    base_seed: int,
    split_batches: bool = False,
) -> PreparedDataLoader:
    """Shard ``loader`` for this rank (see the module docstring); ``device=None`` leaves batches where they are.

    Example::

        shard = prepare_data_loader(DataLoader(ds, batch_size=8, shuffle=True), process_index=rank,
                                    num_processes=world, device=torch.device("cpu"),
                                    gradient_state=GradientState(), base_seed=torch.initial_seed())
    """
    settings = _loader_settings(loader)
    common = dict(gradient_state=gradient_state, device=device, **settings)

    if isinstance(loader.dataset, IterableDataset):
        return _prepare_iterable(loader, process_index, num_processes, base_seed, split_batches, common)

    index_sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    inner_sampler = getattr(index_sampler, "sampler", index_sampler)
    if isinstance(inner_sampler, DistributedSampler):
        warnings.warn(
            "this DataLoader already uses a DistributedSampler, so it is used as is (not sharded again); "
            "prepare() a DataLoader with a plain sampler instead to get synchronized shuffling and exact "
            "gather_for_metrics.",
            stacklevel=3,
        )
        sampling = (
            dict(batch_sampler=loader.batch_sampler)
            if loader.batch_sampler is not None
            else dict(sampler=loader.sampler, batch_size=None)
        )
        per_process = getattr(loader.batch_sampler, "batch_size", None)
        return PreparedDataLoader(
            loader.dataset,
            collate_fn=loader.collate_fn,
            per_process_batch_size=per_process,
            total_batch_size=None if per_process is None else per_process * num_processes,
            **sampling,
            **common,
        )

    batched = loader.batch_sampler is not None
    if batched:
        source, owned, shared = _plan_batch_sampler(loader.batch_sampler)
    else:
        source, owned, shared = _plan_sampler(loader.sampler)
    randomness = EpochRandomness(base_seed, owned, shared)
    full_size = getattr(source, "batch_size", None) if batched else None
    shard = BatchSamplerShard(
        source,
        process_index=process_index,
        num_processes=num_processes,
        split_batches=split_batches,
        drop_last=loader.drop_last,
        full_size=full_size,
        unbatched=not batched,
        randomness=randomness,
    )
    if full_size is None:
        per_process = total = None
    elif split_batches:
        per_process, total = full_size // num_processes, full_size
    else:
        per_process, total = full_size, full_size * num_processes
    sampling = dict(batch_sampler=shard) if batched else dict(sampler=shard, batch_size=None)
    return PreparedDataLoader(
        loader.dataset,
        randomness=randomness,
        collate_fn=loader.collate_fn,
        per_process_batch_size=per_process,
        total_batch_size=total,
        **sampling,
        **common,
    )


def _prepare_iterable(
    loader: DataLoader,
    process_index: int,
    num_processes: int,
    base_seed: int,
    split_batches: bool,
    common: Dict[str, Any],
) -> PreparedDataLoader:
    if loader.num_workers > 0:
        warnings.warn(
            "an IterableDataset with num_workers > 0 is read in full by every worker unless the dataset "
            "splits itself with torch.utils.data.get_worker_info(); the shard is applied on top of that.",
            stacklevel=4,
        )
    batched = loader.batch_size is not None
    batch_size = loader.batch_size if batched else 1
    # A stream must come out the same on every rank. Its per-epoch hooks are set_epoch (called by the
    # prepared loader) and a torch.Generator in `dataset.generator`, which we reseed each epoch as HF
    # accelerate does. No shared-RNG swap here: it would cost ~20 us per *item* (vs per batch).
    generator = getattr(loader.dataset, "generator", None)
    seeded = generator if isinstance(generator, torch.Generator) and not hasattr(loader.dataset, "set_epoch") else None
    randomness = EpochRandomness(base_seed, seeded, shared_stream=False)
    shard = IterableDatasetShard(
        loader.dataset,
        process_index=process_index,
        num_processes=num_processes,
        batch_size=batch_size,
        split_batches=split_batches,
        drop_last=loader.drop_last,
        unbatched=not batched,
        randomness=randomness,
    )
    return PreparedDataLoader(
        shard,
        randomness=randomness,
        tagged=True,
        batch_size=shard.per_rank if batched else None,
        collate_fn=TaggedCollate(loader.collate_fn, batched=batched),
        per_process_batch_size=shard.per_rank if batched else None,
        total_batch_size=shard.per_rank * num_processes if batched else None,
        **common,
    )


class SkippedLoader:
    """``Accelerator.skip_first_batches``: one epoch of a prepared loader without its first ``num_batches`` steps.

    A map-style shard leaves them out at the sampler (their samples are never loaded); any other loader is read and
    the first batches dropped. The epoch is the loader's next one, so a loader restored by ``load_state`` mid-epoch
    resumes that epoch's order.
    """

    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader = loader
        self.num_batches = num_batches

    def _shard(self) -> Optional[BatchSamplerShard]:
        prepared = getattr(self.loader, "prepared", self.loader)  # an XlaDeviceLoader holds the shard's loader
        for candidate in (getattr(prepared, "batch_sampler", None), getattr(prepared, "sampler", None)):
            if isinstance(candidate, BatchSamplerShard):
                return candidate
        return None

    def __iter__(self) -> Iterator[Any]:
        shard = self._shard()
        if shard is not None:
            shard.skip_batches = self.num_batches
            yield from self.loader
            return
        for index, batch in enumerate(self.loader):
            if index >= self.num_batches:
                yield batch

    def __len__(self) -> int:
        return max(len(self.loader) - self.num_batches, 0)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
