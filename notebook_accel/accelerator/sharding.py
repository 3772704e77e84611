"""Split one data stream between ranks so that, together, they see it exactly once per epoch.

Map-style datasets: the loader's batch sampler (any sampler, any batch sampler) runs on every rank, in
lockstep; consecutive batches go to consecutive ranks (batch i -> rank i % world), or, with
``split_batches``, every batch is cut into ``world`` equal slices. A global step therefore covers the
same samples a single process would see with a ``world`` times larger batch, in the same order.

IterableDataset: every rank reads the whole stream and keeps its slice of each ``world * batch`` chunk.

The tail: every rank must run the same number of steps (or the ranks deadlock in DDP's all-reduce), so
a short tail is completed with samples from the start of the epoch, as HF accelerate does. Each step's
:class:`StepLayout` records how many samples of each rank are real, so ``gather_for_metrics`` can drop the
duplicates and return exactly one copy of the dataset.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Any, Callable, Deque, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from torch.utils.data import IterableDataset, Sampler

__all__ = ["StepLayout", "BatchSamplerShard", "IterableDatasetShard", "TaggedCollate", "Randomness"]


class StepLayout(NamedTuple):
    """What every rank holds at one step.

    ``sizes[r]``: samples in rank r's batch (None when the loader does not batch: each item is one unit).
    ``real[r]``: how many of them, from the front, are real (the rest repeat the start of the epoch).
    """

    sizes: Tuple[Optional[int], ...]
    real: Tuple[int, ...]

    @property
    def has_padding(self) -> bool:
        return any(real < (1 if size is None else size) for size, real in zip(self.sizes, self.real))


class Randomness:
    """How a shard drives its source: plainly, or under a :class:`~.rng.SharedRNG` (see data_loader)."""

    def iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return iter(iterable)


def _cycle_forever(head: Sequence[int]) -> Iterator[int]:
    if not head:
        raise ValueError("cannot pad the last step: the first batches of the epoch were empty")
    return itertools.cycle(head)


def _steps_one_batch_per_rank(
    batches: Iterable[List[int]], world: int, full_size: Optional[int], drop_last: bool, even: bool = True
) -> Iterator[List[Tuple[List[int], int]]]:
    """Group batches by ``world`` (one per rank); pad short batches and missing ranks from the start.

    Yields, per step, ``[(indices, real_count)] * world``. ``even=False`` pads nothing: the last step has as many
    entries as batches were left (ranks beyond them get no batch), each batch as it came.
    """
    head: List[int] = []  # indices of the first `world` batches: the padding source
    seen = 0
    group: List[List[int]] = []
    filler: Optional[Iterator[int]] = None

    def complete(group: List[List[int]]) -> List[Tuple[List[int], int]]:
        nonlocal filler
        if filler is None:
            filler = _cycle_forever(head)
        step = []
        for batch in group:
            real = len(batch)
            if world > 1 and full_size is not None and real < full_size:
                batch = batch + [next(filler) for _ in range(full_size - real)]
            step.append((batch, real))
        size = full_size if full_size is not None else len(group[0])
        while len(step) < world:
            step.append(([next(filler) for _ in range(size)], 0))
        return step

    for batch in batches:
        if not isinstance(batch, list):
            batch = list(batch)
        if seen < world:
            head.extend(batch)
            seen += 1
        group.append(batch)
        if len(group) == world:
            short = even and world > 1 and full_size is not None and any(len(b) < full_size for b in group)
            yield complete(group) if short else [(b, len(b)) for b in group]
            group = []
    if group and not drop_last:
        yield complete(group) if even else [(b, len(b)) for b in group]


def _steps_split_batches(
    batches: Iterable[List[int]], world: int, full_size: Optional[int]
) -> Iterator[List[Tuple[List[int], int]]]:
    """Cut every batch into ``world`` equal slices; a short batch is completed from the start first."""
    head: List[int] = []
    filler: Optional[Iterator[int]] = None
    for batch in batches:
        batch = list(batch)
        if not head:
            head = list(batch)
        real = len(batch)
        target = full_size if (full_size is not None and world > 1) else real
        target = math.ceil(max(target, real) / world) * world
        if real < target:
            filler = filler or _cycle_forever(head)
            batch = batch + [next(filler) for _ in range(target - real)]
        per_rank = target // world
        yield [
            (batch[r * per_rank : (r + 1) * per_rank], min(max(real - r * per_rank, 0), per_rank))
            for r in range(world)
        ]


class BatchSamplerShard(Sampler):
    """This rank's share of a (batch) sampler; records each step's :class:`StepLayout` for the loader.

    ``unbatched=True`` wraps a plain sampler of indices (a loader with ``batch_size=None``) and yields
    single indices. The layouts are queued in the order batches are requested, which is the order the
    DataLoader delivers them (``in_order=True``), even with worker processes prefetching ahead.
    """

    def __init__(
        self,
        batch_sampler: Iterable[Any],
        *,
        process_index: int,
        num_processes: int,
        split_batches: bool = False,
        drop_last: bool = False,
        full_size: Optional[int] = None,
        unbatched: bool = False,
        randomness: Optional[Randomness] = None,
    ) -> None:
        if split_batches and full_size is not None and full_size % num_processes:
            raise ValueError(
                f"split_batches=True cuts each batch into {num_processes} equal parts, but the batch size "
                f"{full_size} is not divisible by {num_processes}."
            )
        self.batch_sampler = batch_sampler
        self.process_index = process_index
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.drop_last = drop_last
        self.full_size = 1 if unbatched else full_size
        self.unbatched = unbatched
        self.randomness = randomness or Randomness()
        self.layouts: Deque[StepLayout] = deque()
        # False: the end of an epoch is not padded, ranks may get a batch fewer (DataLoaderConfiguration's
        # even_batches, join_uneven_inputs); with split_batches every step is still cut in equal slices
        self.even_batches = True
        self.skip_batches = 0  # this many steps of the next epoch are left out (Accelerator.skip_first_batches)

    @property
    def sampler(self) -> Any:
        """The underlying sampler (so ``loader.batch_sampler.sampler`` keeps working)."""
        return getattr(self.batch_sampler, "sampler", self.batch_sampler)

    def __len__(self) -> int:
        batches = len(self.batch_sampler)  # type: ignore[arg-type]
        if self.split_batches:
            return batches
        if self.drop_last:
            steps = batches // self.num_processes
        elif self.even_batches:
            steps = math.ceil(batches / self.num_processes)
        else:
            steps = batches // self.num_processes + (self.process_index < batches % self.num_processes)
        return steps

    def __iter__(self) -> Iterator[Any]:
        self.layouts.clear()  # a new epoch: whatever an abandoned epoch queued is stale
        source = self.randomness.iterate(self.batch_sampler)
        if self.unbatched:
            source = ([index] for index in source)
        if self.split_batches:
            steps = _steps_split_batches(source, self.num_processes, self.full_size)
        else:
            steps = _steps_one_batch_per_rank(source, self.num_processes, self.full_size, self.drop_last,
                                              even=self.even_batches)  # fmt: skip
        skip, self.skip_batches = self.skip_batches, 0
        if skip:
            steps = itertools.islice(steps, skip, None)
        layout = None
        for step in steps:
            if self.process_index >= len(step):  # even_batches=False: no batch left for this rank
                continue
            sizes = tuple(None if self.unbatched else len(indices) for indices, _ in step)
            real = tuple(real for _, real in step)
            if layout is None or layout.sizes != sizes or layout.real != real:
                layout = StepLayout(sizes, real)  # steps mostly repeat one layout: share the object
            self.layouts.append(layout)
            indices = step[self.process_index][0]
            yield indices[0] if self.unbatched else indices


class IterableDatasetShard(IterableDataset):
    """This rank's share of an IterableDataset, as ``(item, StepLayout)`` pairs for :class:`TaggedCollate`.

    The stream is read in chunks of ``batch_size * world`` items (``batch_size`` with ``split_batches``);
    rank r keeps the r-th slice of each chunk, so a global step is the next chunk of the stream.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        *,
        process_index: int,
        num_processes: int,
        batch_size: int,
        split_batches: bool = False,
        drop_last: bool = False,
        unbatched: bool = False,
        randomness: Optional[Randomness] = None,
    ) -> None:
        if split_batches and batch_size % num_processes:
            raise ValueError(
                f"split_batches=True cuts each batch into {num_processes} equal parts, but the batch size "
                f"{batch_size} is not divisible by {num_processes}."
            )
        self.dataset = dataset
        self.process_index = process_index
        self.num_processes = num_processes
        self.per_rank = batch_size // num_processes if split_batches else batch_size
        self.drop_last = drop_last
        self.unbatched = unbatched
        self.randomness = randomness or Randomness()

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        chunk = self.per_rank * self.num_processes
        total = len(self.dataset)  # type: ignore[arg-type]  (TypeError, as for any unsized IterableDataset)
        steps = total // chunk if self.drop_last else math.ceil(total / chunk)
        return steps * self.per_rank

    def _layout(self, real_in_chunk: int) -> StepLayout:
        per_rank = self.per_rank
        sizes = tuple(None if self.unbatched else per_rank for _ in range(self.num_processes))
        real = tuple(min(max(real_in_chunk - r * per_rank, 0), per_rank) for r in range(self.num_processes))
        return StepLayout(sizes, real)

    def __iter__(self) -> Iterator[Tuple[Any, StepLayout]]:
        chunk_size = self.per_rank * self.num_processes
        mine = slice(self.process_index * self.per_rank, (self.process_index + 1) * self.per_rank)
        full_layout = self._layout(chunk_size)
        head: List[Any] = []
        chunk: List[Any] = []
        for item in self.randomness.iterate(self.dataset):
            chunk.append(item)
            if len(chunk) == chunk_size:
                for kept in chunk[mine]:
                    yield kept, full_layout
                head = head or chunk
                chunk = []
        if not chunk or self.drop_last:
            return
        if self.num_processes == 1:  # nobody to keep in step with: the short tail as it is
            layout = StepLayout((len(chunk),), (len(chunk),))
            yield from ((item, layout) for item in chunk)
        else:
            real = len(chunk)
            filler = itertools.cycle(head or list(chunk))
            chunk += [next(filler) for _ in range(chunk_size - real)]
            layout = self._layout(real)
            for kept in chunk[mine]:
                yield kept, layout


class TaggedCollate:
    """Collates ``(item, layout)`` pairs with the loader's own collate_fn; returns ``(batch, layout)``.

    The layout travels with the data so it stays right with worker processes, where the shard runs.
    A class (not a closure) so worker processes started with spawn/forkserver can pickle it.
    """

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, samples: Any) -> Tuple[Any, StepLayout]:
        if not self.batched:
            item, layout = samples
            return self.collate_fn(item), layout
        return self.collate_fn([item for item, _ in samples]), samples[0][1]
