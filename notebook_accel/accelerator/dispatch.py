"""``prepare_data_loader(dispatch_batches=True)``, as HF's ``DataLoaderDispatcher``: rank 0 alone reads the
DataLoader and every rank gets its slice of each step's batch (for datasets only one process can read: a stream,
a file handle, a remote source). Without ``split_batches`` a step is ``num_processes`` of the loader's batches put
end to end, with it one batch cut into ``num_processes`` parts."""
from __future__ import annotations

import math
from typing import Any, Iterator, List, Optional, Tuple

import torch

from .gradient_state import GradientState
from .operations import broadcast_object, fill_leaves, send_to_device, tree_leaves
from .sharding import StepLayout


class DispatchedDataLoader:
    """This rank's slices of rank 0's batches; ``end_of_dataloader`` and ``current_layout`` as our prepared loader
    has them (``gather_for_metrics`` drops the samples repeated to even out the last step)."""

    def __init__(self, loader: Any, *, process_index: int, num_processes: int, split_batches: bool,
                 even_batches: bool, device: Optional[torch.device], gradient_state: GradientState) -> None:
        self.base_dataloader = loader
        self.dataset = loader.dataset
        self.batch_size = getattr(loader, "batch_size", None)
        self.process_index, self.num_processes = process_index, num_processes
        self.split_batches, self.even_batches = split_batches, even_batches
        self.device = device
        self.gradient_state = gradient_state
        self.end_of_dataloader = False
        self.current_layout: Optional[StepLayout] = None
        self.non_blocking = False

    def __len__(self) -> int:
        batches = len(self.base_dataloader)
        return batches if self.split_batches else math.ceil(batches / self.num_processes)

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the loader's sampler and dataset (rank 0's are the ones read)."""
        for candidate in (getattr(self.base_dataloader, "sampler", None),
                          getattr(self.base_dataloader, "batch_sampler", None), self.dataset):  # fmt: skip
            if callable(getattr(candidate, "set_epoch", None)):
                candidate.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.end_of_dataloader = False
        self.gradient_state.loader_started(self)
        try:
            source = iter(self.base_dataloader) if self.process_index == 0 else None
            upcoming = self._next_step(source)
            while upcoming is not None:
                step = upcoming
                upcoming = self._next_step(source)  # one step of look-ahead: is this the last?
                mine, self.current_layout = self._my_slice(step)
                self.end_of_dataloader = upcoming is None
                yield mine if self.device is None else send_to_device(mine, self.device)
        finally:
            self.gradient_state.loader_stopped(self)

    def _next_step(self, source: Optional[Iterator[Any]]) -> Any:
        """Rank 0's next step batch on every rank, or None at the end of the epoch."""
        step = None
        if source is not None:
            wanted = 1 if self.split_batches else self.num_processes
            batches: List[Any] = []
            for batch in source:
                batches.append(batch)
                if len(batches) == wanted:
                    break
            step = _end_to_end(batches) if batches else None
        return broadcast_object(step)

    def _my_slice(self, step: Any) -> Tuple[Any, StepLayout]:
        """This rank's part of ``step``: ``ceil(n / num_processes)`` samples each; with ``even_batches`` a short
        last step repeats its own first samples so every rank gets as many."""
        leaves = [leaf for _, leaf in tree_leaves(step)]
        total = len(leaves[0]) if leaves else 0
        per_rank = math.ceil(total / self.num_processes)
        real = tuple(max(0, min(per_rank, total - rank * per_rank)) for rank in range(self.num_processes))
        start = self.process_index * per_rank
        if self.even_batches:
            rows = torch.arange(start, start + per_rank) % max(total, 1)
            sizes: Tuple[Optional[int], ...] = (per_rank,) * self.num_processes
        else:
            rows = torch.arange(start, start + real[self.process_index])
            sizes = real
        mine = fill_leaves(step, [leaf[rows.to(leaf.device)] for leaf in leaves])
        return mine, StepLayout(sizes=sizes, real=real)


def _end_to_end(batches: List[Any]) -> Any:
    """The batches' tensors concatenated along the first dimension, in the first batch's containers."""
    per_batch = [[leaf for _, leaf in tree_leaves(batch)] for batch in batches]
    return fill_leaves(batches[0], [torch.cat(parts) for parts in zip(*per_batch)])
