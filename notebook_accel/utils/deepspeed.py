"""``accelerate.utils``' ``DummyOptim`` / ``DummyScheduler``: placeholders HF code builds when a DeepSpeed config
file has its own ``optimizer`` / ``scheduler`` section. Ours gives DeepSpeed the user's torch optimizer and refuses
such sections (``DeepSpeedPlugin``), so these are never prepared: ``prepare`` refuses them by name."""
from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["DummyOptim", "DummyScheduler", "DUMMY_REFUSAL"]

DUMMY_REFUSAL = ("DeepSpeed config files with their own 'optimizer' / 'scheduler' sections are not offered: build a "
                 "torch optimizer (e.g. torch.optim.AdamW) and scheduler and prepare those")  # fmt: skip


class DummyOptim:
    """HF's placeholder optimizer (its parameters and fields); refused by ``Accelerator.prepare``."""

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """HF's placeholder scheduler (its parameters and fields); refused by ``Accelerator.prepare``."""

    def __init__(self, optimizer: Any, total_num_steps: Optional[int] = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Optional[Callable[[Any], Any]] = None, **kwargs: Any) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
