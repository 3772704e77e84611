"""``prepare(data_loader)``: this rank's shard of a DataLoader, with batches already on the device.

The prepared loader is a real :class:`torch.utils.data.DataLoader` (same dataset, workers, collate_fn,
pin_memory...), built around a :class:`~.sharding.BatchSamplerShard` (map-style datasets) or an
:class:`~.sharding.IterableDatasetShard`. On top of a plain DataLoader it:

- makes the data order identical on every rank, and different each epoch, the way HF accelerate does (see
  :class:`EpochRandomness`: the same seed gives the same order, and the same later random draws, on both
  libraries), so the shards never overlap;
- looks one batch ahead, to know when the current batch is the last one (gradient accumulation syncs
  there);
- remembers each step's :class:`~.sharding.StepLayout` for ``gather_for_metrics``;
- moves every batch to the device (tensors in dicts, lists, tuples, namedtuples).
"""
from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

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
from .operations import broadcast, broadcast_object, send_to_device
from .rng import SharedRNG, epoch_seed
from .sharding import BatchSamplerShard, IterableDatasetShard, Randomness, StepLayout, TaggedCollate

__all__ = ["PreparedDataLoader", "EpochRandomness", "prepare_data_loader", "SkippedLoader"]

# Samplers whose only randomness is their `generator` attribute (when it is None they draw a seed from
# torch's global RNG). Their subclasses may override __iter__, so they get the shared RNG as well.
_GENERATOR_ONLY_SAMPLERS = (RandomSampler, WeightedRandomSampler, SubsetRandomSampler)

_END = object()


class EpochRandomness(Randomness):
    """Makes a sampler's (or an IterableDataset's) random draws identical on every rank, as HF accelerate does.

    The mechanisms, chosen per sampler at prepare time (:func:`_plan_sampler`):

    - ``synchronized`` (HF's default, ``use_seedable_sampler=False``): the sampler's ``generator``, which
      ``prepare`` gave it if it had none, seeded once from a draw on the global torch RNG (HF's
      ``int(torch.empty((), dtype=torch.int64).random_().item())``). At the start of each iteration every rank
      takes rank 0's state of it (HF's ``synchronize_rng_states(["generator"], generator)``); it is never reseeded,
      so each epoch goes on from where the last one left it. A user's own generator is synchronized the same way,
      not reseeded.
    - ``reseeded``: a generator reseeded with ``base_seed + epoch`` at each epoch (``use_seedable_sampler=True``:
      HF's ``SeedableRandomSampler``, ``base_seed`` being ``data_seed`` or ``torch.initial_seed()``) or with
      ``epoch`` (an IterableDataset's own ``generator`` when it has no ``set_epoch``: HF's
      ``IterableDatasetShard``).
    - ``shared_stream``: any other sampler runs under a :class:`~.rng.SharedRNG` (torch + python global
      RNG, swapped in only around its own calls), seeded ``base_seed + epoch``. HF has no equivalent (there
      such a sampler draws from each rank's own global RNG, the same only where every rank was seeded alike).
    """

    def __init__(
        self,
        base_seed: int,
        reseeded: Optional[torch.Generator] = None,
        shared_stream: bool = False,
        synchronized: Optional[torch.Generator] = None,
    ) -> None:
        self.base_seed = base_seed
        self.reseeded = reseeded
        self.shared_stream = shared_stream
        self.synchronized = synchronized
        self.epoch_start_state: Optional[torch.Tensor] = None  # the synchronized generator's, this epoch
        self._shared: Optional[SharedRNG] = None

    def synchronize(self) -> None:
        """The collective part of an iteration's start (every rank at once, in the thread that iterates)."""
        if self.synchronized is not None:
            _take_rank_zero_state(self.synchronized)

    def begin_epoch(self, epoch: int) -> None:
        if self.synchronized is not None:
            self.epoch_start_state = self.synchronized.get_state()
        if self.reseeded is not None:
            self.reseeded.manual_seed(epoch_seed(self.base_seed, epoch))
        self._shared = SharedRNG(epoch_seed(self.base_seed, epoch)) if self.shared_stream else None

    def iterate(self, iterable: Any) -> Iterator[Any]:
        return self._shared.iterate(iterable) if self._shared is not None else iter(iterable)

    def generator_state(self, running: bool) -> Optional[torch.Tensor]:
        """For a checkpoint: the synchronized generator's state the next iteration starts from (``running``: the
        current epoch's start, so that resuming replays its order), None without one."""
        if self.synchronized is None:
            return None
        if running and self.epoch_start_state is not None:
            return self.epoch_start_state
        return self.synchronized.get_state()


# HF's rng_types that name a global RNG: how to read and set its state
_GLOBAL_RNGS = {
    "torch": (torch.get_rng_state, torch.set_rng_state),
    "cuda": (lambda: torch.cuda.get_rng_state(), lambda state: torch.cuda.set_rng_state(state)),
}


def synchronize_global_rngs(rng_types: Sequence[str]) -> None:
    """HF's ``synchronize_rng_states(rng_types)`` at a prepared loader's iteration start, for the global RNGs among
    them ("torch"; "cuda" where CUDA is in use): every rank takes rank 0's state (a no-op for one process)."""
    for kind in rng_types:
        if kind in _GLOBAL_RNGS and (kind != "cuda" or torch.cuda.is_initialized()):
            get, put = _GLOBAL_RNGS[kind]
            put(broadcast_object(get()))


def _take_rank_zero_state(generator: torch.Generator) -> None:
    """Every rank's ``generator`` takes rank 0's state (a no-op for one process)."""
    generator.set_state(broadcast(generator.get_state()))


def _drawn_generator() -> torch.Generator:
    """HF's generator for a sampler without one: seeded from one draw on the global torch RNG (which the draw
    advances, as on HF: later dropout and initialisations see the same stream on both libraries)."""
    generator = torch.Generator()
    generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return generator


def _in_lockstep(num_processes: int, seedable: bool) -> bool:
    """Whether a sampler drawing from the global RNG runs under the shared stream: on several processes (HF has no
    equivalent: there each rank draws its own), and on one with ``use_seedable_sampler`` (its order then depends on
    the seed and the epoch only, the same for 1 or N processes)."""
    return num_processes > 1 or seedable


def _plan_sampler(sampler: Any, num_processes: int, seedable: bool, base_seed: int) -> Tuple[Any, EpochRandomness]:
    """Returns ``(sampler to use, its randomness)``: HF's ``prepare_data_loader`` choices (see EpochRandomness).

    As on HF, one process leaves a sampler as it is in the default mode (a ``RandomSampler`` without a generator
    then draws a new seed from the global RNG each epoch), and ``use_seedable_sampler`` touches only
    ``RandomSampler``\\ s (and, here, the other generator-only samplers: HF leaves them unsynchronized)."""
    if type(sampler) is SequentialSampler:
        return sampler, EpochRandomness(base_seed)
    generator = getattr(sampler, "generator", False)
    shared = type(sampler) not in _GENERATOR_ONLY_SAMPLERS and _in_lockstep(num_processes, seedable)
    if seedable:
        if generator is None:
            sampler = copy.copy(sampler)  # leave the user's DataLoader untouched
            sampler.generator = torch.Generator()
        reseeded = sampler.generator if isinstance(getattr(sampler, "generator", None), torch.Generator) else None
        return sampler, EpochRandomness(base_seed, reseeded=reseeded, shared_stream=shared)
    if num_processes == 1:
        return sampler, EpochRandomness(base_seed)
    if generator is None:
        sampler = copy.copy(sampler)
        sampler.generator = _drawn_generator()
    synchronized = sampler.generator if isinstance(getattr(sampler, "generator", None), torch.Generator) else None
    return sampler, EpochRandomness(base_seed, shared_stream=shared, synchronized=synchronized)


def _plan_batch_sampler(batch_sampler: Any, num_processes: int, seedable: bool,
                        base_seed: int) -> Tuple[Any, EpochRandomness]:  # fmt: skip
    """:func:`_plan_sampler` for the sampler inside ``batch_sampler`` (HF's ``get_sampler``); a custom batch
    sampler also runs under the shared stream (:func:`_in_lockstep`): whatever it draws, it draws in lockstep."""
    custom = type(batch_sampler) is not BatchSampler and _in_lockstep(num_processes, seedable)
    inner = getattr(batch_sampler, "sampler", None)
    if inner is None:
        return batch_sampler, EpochRandomness(base_seed, shared_stream=custom)
    sampler, randomness = _plan_sampler(inner, num_processes, seedable, base_seed)
    randomness.shared_stream = randomness.shared_stream or custom
    if sampler is not inner:
        batch_sampler = copy.copy(batch_sampler)  # leave the user's DataLoader untouched
        batch_sampler.sampler = sampler
    return batch_sampler, randomness


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
        # Accelerator(rng_types=[..."torch", "cuda"]): these global RNGs take rank 0's state at each iteration's start
        self.global_rng_types: Tuple[str, ...] = ()

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

    def synchronize_rngs(self) -> None:
        """HF's ``synchronize_rng_states`` at an iteration's start: the sampler's generator and the ``rng_types``
        global RNGs take rank 0's state (collectives: every rank calls it at once)."""
        synchronize_global_rngs(self.global_rng_types)
        if self.randomness is not None:
            self.randomness.synchronize()

    def steps(self, on_device: bool = True,
              synchronize: bool = True) -> Iterator[Tuple[Any, bool, Optional[StepLayout]]]:  # fmt: skip
        """One epoch of ``(batch, is_last, layout)``, without touching the gradient state: whoever hands the
        batches to the user records them (``__iter__`` here; on XLA the :class:`XlaDeviceLoader`, since
        torch_xla's loader takes them from here in its prefetch thread, ahead of the user).
        ``on_device=False`` leaves the batch where the DataLoader made it (torch_xla moves it); ``synchronize=False``:
        the caller ran :meth:`synchronize_rngs` itself (on XLA, in the user's thread, not the prefetch thread, as
        HF's ``MpDeviceLoaderWrapper``)."""
        self.epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        if synchronize:
            self.synchronize_rngs()
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
        for batch, last, layout in self.prepared.steps(on_device=False, synchronize=False):
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
        self.prepared.synchronize_rngs()  # collectives belong in this thread, not torch_xla's prefetch thread
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
    use_seedable_sampler: bool = False,
) -> PreparedDataLoader:
    """Shard ``loader`` for this rank (see the module docstring); ``device=None`` leaves batches where they are.

    The data order is HF accelerate's (:class:`EpochRandomness`): by default a shuffling sampler's generator is
    seeded once here, from a draw on the global torch RNG, and each iteration starts from rank 0's state of it;
    ``use_seedable_sampler=True`` reseeds it with ``base_seed + epoch`` at each epoch instead. ``base_seed`` (the
    same on every rank: ``data_seed``, else rank 0's ``torch.initial_seed()``) also seeds the shared stream of
    samplers that draw from the global RNG.

    Example::

        shard = prepare_data_loader(DataLoader(ds, batch_size=8, shuffle=True), process_index=rank,
                                    num_processes=world, device=torch.device("cpu"),
                                    gradient_state=GradientState(), base_seed=torch.initial_seed())
    """
    settings = _loader_settings(loader)
    common = dict(gradient_state=gradient_state, device=device, **settings)

    if isinstance(loader.dataset, IterableDataset):
        return _prepare_iterable(loader, process_index, num_processes, split_batches, common)

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
        source, randomness = _plan_batch_sampler(loader.batch_sampler, num_processes, use_seedable_sampler, base_seed)
    else:
        source, randomness = _plan_sampler(loader.sampler, num_processes, use_seedable_sampler, base_seed)
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
    # prepared loader) and a torch.Generator in `dataset.generator`, as on HF: on several processes it takes rank 0's
    # state at each iteration's start, and without a set_epoch it is then reseeded with the epoch number (HF's
    # IterableDatasetShard). No shared-RNG swap here: it would cost ~20 us per *item* (vs per batch).
    generator = getattr(loader.dataset, "generator", None)
    generator = generator if isinstance(generator, torch.Generator) and num_processes > 1 else None
    reseeded = generator if not hasattr(loader.dataset, "set_epoch") else None
    randomness = EpochRandomness(0, reseeded=reseeded, synchronized=generator)
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
