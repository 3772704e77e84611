"""The little state that the accelerator, its optimizers, schedulers and data loaders share per step."""
from __future__ import annotations

from typing import Any, List, Optional

from .sharding import StepLayout

__all__ = ["GradientState"]


class GradientState:
    """Whether this step ends a gradient-accumulation cycle, and which prepared loader is iterating.

    ``sync_gradients`` is True on steps where the optimizer really steps (always, without accumulation);
    the optimizer and scheduler wrappers read it to skip accumulation steps. Loaders push themselves on
    ``active_loaders`` while they iterate (an eval loop inside a train loop is the inner one), so
    ``end_of_dataloader`` and ``current_layout`` refer to the batch the user is holding now.
    """

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        """``gradient_accumulation_plugin``: HF's ``GradientAccumulationPlugin``, or the number of steps (ours)."""
        accumulation_steps = getattr(gradient_accumulation_plugin, "num_steps", gradient_accumulation_plugin)
        accumulation_steps = 1 if accumulation_steps is None else accumulation_steps
        if accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {accumulation_steps}")
        self.accumulation_steps = accumulation_steps
        self.sync_gradients = True
        self.active_loaders: List[Any] = []

    @property
    def active_loader(self) -> Optional[Any]:
        return self.active_loaders[-1] if self.active_loaders else None

    # HF's names
    active_dataloader = active_loader

    @property
    def in_dataloader(self) -> bool:
        return self.active_loader is not None

    @property
    def num_steps(self) -> int:
        return self.accumulation_steps

    @property
    def dataloader_references(self) -> List[Any]:
        return [None, *self.active_loaders]

    @staticmethod
    def _reset_state() -> None:
        """HF's GradientState is one per process, so its tests reset it before a second Accelerator; ours is one per
        Accelerator (a new Accelerator starts clean): nothing to reset."""

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_loader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def current_layout(self) -> Optional[StepLayout]:
        loader = self.active_loader
        return None if loader is None else loader.current_layout

    def loader_started(self, loader: Any) -> None:
        self.active_loaders.append(loader)

    def loader_stopped(self, loader: Any) -> None:
        if loader in self.active_loaders:
            # remove the last occurrence: the innermost iteration of that loader
            index = len(self.active_loaders) - 1 - self.active_loaders[::-1].index(loader)
            del self.active_loaders[index]
