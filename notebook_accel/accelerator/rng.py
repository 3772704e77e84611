"""Seeding, RNG snapshots for checkpoints, and the RNG stream that all ranks share for data order.

Why a shared stream: a sampler that shuffles with torch's (or python's) global RNG would shuffle
differently on every rank, and sharding would then hand out overlapping samples. Rather than forcing one
global RNG on every rank (which would also make every rank's dropout identical), the sampler's own calls
run with a *separate* stream, seeded identically on all ranks; the user's global streams are untouched.
"""
from __future__ import annotations

import contextlib
import random
from typing import Any, Dict, Iterable, Iterator, TypeVar

import torch

__all__ = ["set_seed", "capture_rng_states", "restore_rng_states", "SharedRNG", "epoch_seed", "torch_random_state"]

T = TypeVar("T")


def set_seed(seed: int, device_specific: bool = False, process_index: int = 0) -> int:
    """Seed python's ``random``, numpy and torch (CPU and every CUDA device); returns the seed used.

    ``device_specific=True`` offsets the seed by the rank, for augmentations that should differ per rank.

    Example::

        set_seed(42)   # the same model init and data order on every rank and every run
    """
    if device_specific:
        seed += process_index
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # numpy is optional
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


@contextlib.contextmanager
def torch_random_state(state: torch.Tensor) -> Iterator[None]:
    """Torch's CPU generator runs from ``state`` inside the block (e.g. rank 0's, on every rank). Afterwards it
    goes on from where the block left it if it was at ``state`` already, else it returns to where it was (a rank
    seeded on its own keeps its own stream)."""
    own = torch.get_rng_state()
    already = torch.equal(own, state)
    if not already:
        torch.set_rng_state(state)
    try:
        yield
    finally:
        if not already:
            torch.set_rng_state(own)


def capture_rng_states() -> Dict[str, Any]:
    """Every global RNG state of this process (python, numpy, torch CPU, CUDA), for a checkpoint."""
    states: Dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        states["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: Dict[str, Any]) -> None:
    """Undo :func:`capture_rng_states` (missing entries are left alone)."""
    if "python" in states:
        random.setstate(states["python"])
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class SharedRNG:
    """A torch + python RNG stream that is swapped in only while a sampler (or dataset) runs.

    Seeded with the same value on every rank, it makes any sampler that draws from the global RNG
    shuffle identically everywhere, without consuming or disturbing the user's own global streams.
    (numpy's global RNG is not swapped: saving and restoring it costs ~70 µs, too much per batch.)
    """

    def __init__(self, seed: int) -> None:
        self._torch_state = torch.Generator().manual_seed(seed).get_state()
        self._python_state = random.Random(seed).getstate()

    def _swap(self) -> tuple:
        """Make this stream the global one; returns the user's states for :meth:`_unswap`."""
        users = torch.get_rng_state(), random.getstate()
        torch.set_rng_state(self._torch_state)
        random.setstate(self._python_state)
        return users

    def _unswap(self, users: tuple) -> None:
        self._torch_state, self._python_state = torch.get_rng_state(), random.getstate()
        torch.set_rng_state(users[0])
        random.setstate(users[1])

    def iterate(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable`` with this stream as the global RNG during ``iter()`` and each ``next()``.

        ``iter()`` counts: a sampler whose ``__iter__`` is a plain function shuffles right there.
        """
        users = self._swap()
        try:
            iterator = iter(iterable)
        finally:
            self._unswap(users)
        while True:
            users = self._swap()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self._unswap(users)
            yield item


def epoch_seed(base_seed: int, epoch: int) -> int:
    """The data-order seed of one epoch: different each epoch, identical on every rank."""
    return (base_seed + epoch) % 2**63
