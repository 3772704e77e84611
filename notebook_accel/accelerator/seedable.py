"""HF's ``SeedableRandomSampler`` (``use_seedable_sampler=True``): a ``RandomSampler`` reseeded with ``seed + epoch``
at each pass. Here, for the Accelerator's ``prepare`` and for ``notebook_accel.data_loader`` (HF's import path, which
re-exports it) alike: the accelerator side does not import the HF-style modules."""
from __future__ import annotations

import copy
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from .data_loader import _loader_settings

__all__ = ["SeedableRandomSampler"]


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends on a seed and the epoch only (``set_epoch``): every rank that builds
    one with the same seed draws the same permutation for the same epoch; each pass moves to the next epoch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        data_seed = kwargs.pop("data_seed", None)
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def _with_seedable_sampler(dataloader: DataLoader, data_seed: int) -> DataLoader:
    """HF's ``use_seedable_sampler``: the loader's plain ``RandomSampler`` (under a plain ``BatchSampler``) swapped
    for a :class:`SeedableRandomSampler` seeded ``data_seed``, which the prepared loader keeps (HF's checks read it
    at ``prepared.batch_sampler.batch_sampler.sampler``). Any other sampler is left as it is."""
    batch_sampler = dataloader.batch_sampler
    if type(batch_sampler) is not BatchSampler or type(batch_sampler.sampler) is not RandomSampler:
        return dataloader
    sampler = batch_sampler.sampler
    seedable = copy.copy(batch_sampler)  # leave the user's DataLoader untouched
    seedable.sampler = SeedableRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                             num_samples=sampler._num_samples, generator=sampler.generator,
                                             data_seed=data_seed)  # fmt: skip
    return DataLoader(dataloader.dataset, batch_sampler=seedable, collate_fn=dataloader.collate_fn,
                      **_loader_settings(dataloader))
