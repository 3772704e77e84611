"""``accelerate.local_sgd``: ``LocalSGD``, gradients kept local and the ranks' weights averaged every N steps.

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            ...
            optimizer.step(); optimizer.zero_grad()
            local_sgd.step()               # every 8th call: all ranks' parameters become their mean

Fewer all-reduces (one per N steps instead of one per backward). Leaving the block averages once more.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .accelerator.state import DistributedType

__all__ = ["LocalSGD"]


class LocalSGD:
    """Local SGD (HF's): inside the block the model's backward does not sync gradients (``accelerator.no_sync``);
    :meth:`step` averages the parameters over the ranks every ``local_sgd_steps`` calls. One process, or
    ``enabled=False``: nothing is changed. Under FSDP2 or DeepSpeed (sharded weights) it is refused."""

    def __init__(self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU,
                                                DistributedType.MULTI_GPU):  # fmt: skip
            raise NotImplementedError(f"LocalSGD is offered on DDP (MULTI_CPU, MULTI_GPU) only, not on "
                                      f"{accelerator.distributed_type.value}: drop LocalSGD there (FSDP2 and "
                                      "DeepSpeed shard the weights instead)")  # fmt: skip
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: Optional[Any] = None
        if self.enabled:
            self._no_sync = accelerator.no_sync(model)
            self._no_sync.__enter__()

    def __enter__(self) -> "LocalSGD":
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if self.enabled and self._no_sync is not None:
            self._sync_and_avg_model_params()
            self._no_sync.__exit__(kind, value, traceback)
            self._no_sync = None

    def step(self) -> None:
        """Count a step; every ``local_sgd_steps``-th one averages the parameters over the ranks."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.accelerator.unwrap_model(self.model).parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
