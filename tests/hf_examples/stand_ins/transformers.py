"""Stand-in for the absent ``transformers`` package (not installed; no network): just what HF accelerate's
examples call — a word-hashing tokenizer, a tiny sequence classifier and causal language model, the linear warm-up
and constant schedules, ``set_seed``."""
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
    """Word ids 1..VOCAB-1; id 0 is the end-of-sequence token (the autoregressive example pads with it)."""

    eos_token = "</s>"
    pad_token: Optional[str] = None

    @property
    def pad_token_id(self) -> Optional[int]:
        return 0 if self.pad_token == self.eos_token else None

    def __call__(self, first: List[str], second: Optional[List[str]] = None, truncation: bool = True,
                 max_length: Optional[int] = None, return_attention_mask: bool = True) -> Dict[str, List[List[int]]]:
        texts = first if second is None else [f"{a} | {b}" for a, b in zip(first, second)]
        ids = [[1 + sum(map(ord, word)) % (VOCAB - 1) for word in text.split()] for text in texts]
        if not return_attention_mask:
            return {"input_ids": ids}
        return {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]}

    def pad(self, examples: List[Dict[str, Any]], padding: str = "longest", max_length: Optional[int] = None,
            pad_to_multiple_of: Optional[int] = None, return_tensors: str = "pt") -> BatchEncoding:
        length = max_length or max(len(example["input_ids"]) for example in examples)
        if pad_to_multiple_of:
            length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
        batch = {key: [list(example[key]) + [0] * (length - len(example[key])) for example in examples]
                 for key in ("input_ids", "attention_mask") if key in examples[0]}  # fmt: skip
        if "labels" in examples[0]:
            batch["labels"] = [example["labels"] for example in examples]
        return BatchEncoding({key: torch.tensor(value) for key, value in batch.items()})


class AutoTokenizer:
    @staticmethod
    def from_pretrained(name: str, **kwargs: Any) -> _Tokenizer:
        return _Tokenizer()


_SCALE = 20000.0


class _Classifier(torch.nn.Module):
    """Mean of word embeddings -> 2 logits; the same "pretrained" weights in every process. Its parameters are stored
    divided by :data:`_SCALE` and used multiplied by it, and its logits start near 0 (a small head, no bias): the
    examples' learning rate (2e-5, warmed up over 100 steps) then moves its predictions within their few steps, so
    that the printed accuracy/F1 tell apart trainings that differ (a learning rate, a step)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, 2)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / _SCALE)
            self.head.weight.mul_(0.01)
            self.head.bias.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: Optional[torch.Tensor] = None,
                **kwargs: Any) -> SimpleNamespace:
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * _SCALE * mask).sum(1) / mask.sum(1).clamp(min=1)
        logits = torch.nn.functional.linear(pooled, self.head.weight * _SCALE, self.head.bias * _SCALE)
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


class AutoModelForSequenceClassification:
    @staticmethod
    def from_pretrained(name: str, **kwargs: Any) -> _Classifier:
        return _Classifier()


class _CausalLM(torch.nn.Module):
    """Next-token logits from each token's embedding alone; the loss sums over the labels not -100 and divides by
    ``num_items_in_batch`` when given (as Transformers' models do), else by their count."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, VOCAB)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)

    def forward(self, input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None,
                num_items_in_batch: Optional[int] = None, **kwargs: Any) -> SimpleNamespace:
        logits = self.head(self.embed(input_ids))
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                     reduction="sum")  # fmt: skip
            loss = loss / (num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum())
        return SimpleNamespace(loss=loss, logits=logits)


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(name: str, **kwargs: Any) -> _CausalLM:
        return _CausalLM()


def get_constant_schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


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
