"""Stand-in for the absent ``transformers`` package (not installed; no network): just what HF accelerate's
examples call — a word-hashing tokenizer, a tiny sequence classifier, the linear warm-up schedule, ``set_seed``."""
from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import torch

VOCAB = 64


class BatchEncoding(dict):
    """A dict of tensors with ``.to(device)``, as ``tokenizer.pad(..., return_tensors="pt")`` returns."""

    def to(self, device: Any) -> "BatchEncoding":
        return BatchEncoding({key: value.to(device) for key, value in self.items()})


class _Tokenizer:
    def __call__(self, first: List[str], second: List[str], truncation: bool = True,
                 max_length: Optional[int] = None) -> Dict[str, List[List[int]]]:
        ids = [[1 + sum(map(ord, word)) % (VOCAB - 1) for word in f"{a} | {b}".split()] for a, b in zip(first, second)]
        return {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]}

    def pad(self, examples: List[Dict[str, Any]], padding: str = "longest", max_length: Optional[int] = None,
            pad_to_multiple_of: Optional[int] = None, return_tensors: str = "pt") -> BatchEncoding:
        length = max_length or max(len(example["input_ids"]) for example in examples)
        if pad_to_multiple_of:
            length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
        batch = {key: [list(example[key]) + [0] * (length - len(example[key])) for example in examples]
                 for key in ("input_ids", "attention_mask")}  # fmt: skip
        batch["labels"] = [example["labels"] for example in examples]
        return BatchEncoding({key: torch.tensor(value) for key, value in batch.items()})


class AutoTokenizer:
    @staticmethod
    def from_pretrained(name: str, **kwargs: Any) -> _Tokenizer:
        return _Tokenizer()


class _Classifier(torch.nn.Module):
    """Mean of word embeddings -> 2 logits; the same "pretrained" weights in every process."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, 2)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: Optional[torch.Tensor] = None,
                **kwargs: Any) -> SimpleNamespace:
        mask = attention_mask.unsqueeze(-1).float()
        logits = self.head((self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1))
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


class AutoModelForSequenceClassification:
    @staticmethod
    def from_pretrained(name: str, **kwargs: Any) -> _Classifier:
        return _Classifier()


def get_linear_schedule_with_warmup(optimizer: torch.optim.Optimizer, num_warmup_steps: int,
                                    num_training_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
