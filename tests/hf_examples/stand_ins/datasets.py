"""Stand-in for the absent ``datasets`` package (not installed; no network): ``load_dataset("glue", "mrpc")`` gives
a few dozen made-up sentence pairs (label 1: the second repeats the first's words), with the ``map`` /
``rename_column`` that HF accelerate's examples call."""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, List

WORDS = "the a cat dog sat ran on under mat log fast slow red blue big small".split()


class Dataset:
    def __init__(self, columns: Dict[str, List[Any]]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, index: int) -> Dict[str, Any]:
        return {key: values[index] for key, values in self.columns.items()}

    def map(self, function: Callable[[Dict[str, List[Any]]], Dict[str, List[Any]]], batched: bool = True,
            remove_columns: List[str] = ()) -> "Dataset":
        columns = {key: values for key, values in self.columns.items() if key not in remove_columns}
        return Dataset({**columns, **function(self.columns)})

    def rename_column(self, old: str, new: str) -> "Dataset":
        return Dataset({(new if key == old else key): values for key, values in self.columns.items()})


class DatasetDict(dict):
    def map(self, *args: Any, **kwargs: Any) -> "DatasetDict":
        return DatasetDict({split: dataset.map(*args, **kwargs) for split, dataset in self.items()})

    def rename_column(self, old: str, new: str) -> "DatasetDict":
        return DatasetDict({split: dataset.rename_column(old, new) for split, dataset in self.items()})


def _split(rows: int, seed: int) -> Dataset:
    chooser = random.Random(seed)
    columns: Dict[str, List[Any]] = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for index in range(rows):
        first = chooser.choices(WORDS, k=6)
        label = index % 2
        second = first[::-1] if label else chooser.choices(WORDS, k=6)
        for key, value in zip(columns, (" ".join(first), " ".join(second), label, index)):
            columns[key].append(value)
    return Dataset(columns)


def load_dataset(path: str, name: str = "mrpc", **kwargs: Any) -> DatasetDict:
    return DatasetDict(train=_split(64, 1), validation=_split(40, 2), test=_split(8, 3))
