"""``prepare_data_loader(dispatch_batches=True)`` (HF's ``DataLoaderDispatcher``): rank 0 alone reads the loader,
every rank gets its slice of each step; a short last step is evened out and its layout says which rows are real."""
from __future__ import annotations

import os
from typing import Any, Dict, List

import torch
from torch.utils.data import DataLoader, IterableDataset

from notebook_accel import notebook_launcher


class _OnlyRankZeroReads(IterableDataset):
    """A source only one process can read (a stream, a socket): any other rank reading it fails."""

    def __iter__(self):
        if os.environ["RANK"] != "0":
            raise RuntimeError(f"rank {os.environ['RANK']} read the dataset")
        return iter(range(13))


def _dispatched() -> Dict[str, Any]:
    from notebook_accel.data_loader import DataLoaderDispatcher, prepare_data_loader

    found: Dict[str, Any] = {}
    for even_batches in (True, False):
        loader = prepare_data_loader(DataLoader(_OnlyRankZeroReads(), batch_size=3), dispatch_batches=True,
                                     even_batches=even_batches)  # fmt: skip
        assert isinstance(loader, DataLoaderDispatcher)
        steps: List[Any] = []
        for batch in loader:
            steps.append((batch.tolist(), tuple(loader.current_layout.real), loader.end_of_dataloader))
        found[f"even={even_batches}"] = steps
    split = prepare_data_loader(DataLoader(list(range(8)), batch_size=4), split_batches=True, dispatch_batches=True)
    found["split"] = (len(split), [batch.tolist() for batch in split])
    return found


def test_rank_zero_reads_and_every_rank_gets_its_slice():
    ranks = notebook_launcher(_dispatched, num_processes=2, device="cpu", display="none", return_all=True)
    # a step is 2 of the loader's batches of 3, end to end; each rank takes 3 rows; 13 = 2 full steps + 1 row
    assert [steps for steps, *_ in ranks[0]["even=True"]] == [[0, 1, 2], [6, 7, 8], [12]]
    assert [steps for steps, *_ in ranks[1]["even=True"]] == [[3, 4, 5], [9, 10, 11], [12]]  # 12 repeated to even
    assert [(real, last) for _, real, last in ranks[1]["even=True"]] == [((3, 3), False), ((3, 3), False),
                                                                          ((1, 0), True)]  # fmt: skip
    assert [steps for steps, *_ in ranks[1]["even=False"]] == [[3, 4, 5], [9, 10, 11], []]
    assert ranks[0]["split"] == (2, [[0, 1], [4, 5]]) and ranks[1]["split"] == (2, [[2, 3], [6, 7]])
