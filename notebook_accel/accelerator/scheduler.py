"""``prepare(scheduler)``: an LR scheduler that steps with the optimizer, as many times as HF accelerate steps it."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List

from .gradient_state import GradientState
from .optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps an LR scheduler so the loop can call ``scheduler.step()`` after every batch, as before.

    It steps only with a real optimizer step: not on gradient-accumulation steps, not when fp16 skipped
    the optimizer step. Then, as HF accelerate does, it steps ``num_processes`` times (once with
    ``split_batches``): each rank's loader holds ``1/num_processes`` of the batches, so a schedule sized
    before ``prepare`` as ``len(train_dataloader) * epochs`` ends with the training, and HF code gets HF's
    learning rates. A ``OneCycleLR`` is not stepped past its ``total_steps``. On accumulation steps, with
    ``GradientAccumulationPlugin(adjust_scheduler=True)`` (the default), the scheduler's ``_step_count`` still
    counts up, as in HF (it only silences torch's order warning; the learning rate does not move).

    ``step_with_optimizer=False`` (``Accelerator(step_scheduler_with_optimizer=False)``): every ``step()`` call
    advances the schedule, accumulation steps included (a schedule counted in batches).
    """

    def __init__(
        self, scheduler: Any, optimizers: Iterable[AcceleratedOptimizer], gradient_state: GradientState,
        step_with_optimizer: bool = True, num_processes: int = 1, split_batches: bool = False,
        adjust_scheduler: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers: List[AcceleratedOptimizer] = list(optimizers)
        self.gradient_state = gradient_state
        self.step_with_optimizer = step_with_optimizer
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.adjust_scheduler = adjust_scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule if the optimizer really stepped."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.adjust_scheduler and hasattr(self.scheduler, "_step_count"):
                self.scheduler._step_count += 1
            return
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return
        for _ in range(1 if self.split_batches else self.num_processes):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR raises when stepped past its end
            if total is None or self.scheduler._step_count <= total:
                self.scheduler.step(*args, **kwargs)

    def get_lr(self) -> List[float]:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def get_last_lr(self) -> List[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> Dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # anything else (last_epoch, base_lrs, optimizer...) is the wrapped scheduler's
        if name == "scheduler":  # not set yet (unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"
