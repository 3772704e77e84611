"""Stand-in for the absent ``datasets`` package (not installed; no network): ``load_dataset("glue", "mrpc")`` gives
a few dozen made-up sentence pairs (label 1: the second repeats the first's words), ``load_dataset(".../wikitext",
...)`` a few hundred made-up lines of text (some empty, as wikitext's are), with the ``map`` / ``filter`` /
``select`` / ``rename_column`` / column access that HF accelerate's examples call."""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, Iterable, List, Optional

WORDS = "the a cat dog sat ran on under mat log fast slow red blue big small".split()


class Dataset:
    def __init__(self, columns: Dict[str, List[Any]]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    @property
    def num_rows(self) -> int:
        return len(self)

    def __getitem__(self, index: Any) -> Any:
        """A row by its index, or a whole column by its name."""
        if isinstance(index, str):
            return self.columns[index]
        return {key: values[int(index)] for key, values in self.columns.items()}

    def select(self, indices: Iterable[int]) -> "Dataset":
        rows = [int(index) for index in indices]
        return Dataset({key: [values[row] for row in rows] for key, values in self.columns.items()})

    def filter(self, function: Callable[[Any], bool], input_columns: Optional[str] = None) -> "Dataset":
        keep = [row for row in range(len(self))
                if function(self.columns[input_columns][row] if input_columns else self[row])]  # fmt: skip
        return self.select(keep)

    def map(self, function: Callable[[Dict[str, List[Any]]], Dict[str, List[Any]]], batched: bool = True,
            remove_columns: List[str] = ()) -> "Dataset":
        columns = {key: values for key, values in self.columns.items() if key not in remove_columns}
        return Dataset({**columns, **function(self.columns)})

    def rename_column(self, old: str, new: str) -> "Dataset":
        return Dataset({(new if key == old else key): values for key, values in self.columns.items()})


class DatasetDict(dict):
    def filter(self, *args: Any, **kwargs: Any) -> "DatasetDict":
        return DatasetDict({split: dataset.filter(*args, **kwargs) for split, dataset in self.items()})

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


def _text(rows: int, seed: int) -> Dataset:
    """Lines of 3 to 8 words; every fifth one empty."""
    chooser = random.Random(seed)
    return Dataset({"text": ["" if index % 5 == 4 else " ".join(chooser.choices(WORDS, k=chooser.randint(3, 8)))
                             for index in range(rows)]})  # fmt: skip


def load_dataset(path: str, name: str = "mrpc", **kwargs: Any) -> DatasetDict:
    if "wikitext" in path:  # the autoregressive example selects its first 500 training lines
        return DatasetDict(train=_text(520, 1), validation=_text(80, 2), test=_text(8, 3))
    return DatasetDict(train=_split(64, 1), validation=_split(40, 2), test=_split(8, 3))
