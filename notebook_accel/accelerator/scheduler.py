"""``prepare(scheduler)``: an LR scheduler that steps once per *optimizer* step."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List

from .gradient_state import GradientState
from .optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps an LR scheduler so the loop can call ``scheduler.step()`` after every batch, as before.

    It steps once per real optimizer step: not on gradient-accumulation steps, not when fp16 skipped
    the optimizer step. Unlike HF accelerate it does *not* step ``num_processes`` times per step: a
    global step is one optimizer step whatever the world size, so a schedule written for one process
    (in optimizer steps) means the same thing on N.

    ``step_with_optimizer=False`` (``Accelerator(step_scheduler_with_optimizer=False)``): every ``step()`` call
    advances the schedule, accumulation steps included (a schedule counted in batches).
    """

    def __init__(
        self, scheduler: Any, optimizers: Iterable[AcceleratedOptimizer], gradient_state: GradientState,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers: List[AcceleratedOptimizer] = list(optimizers)
        self.gradient_state = gradient_state
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule if the optimizer really stepped."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return
        self.scheduler.step(*args, **kwargs)

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
