"""``prepare(optimizer)``: an optimizer that knows about loss scaling and gradient accumulation."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from .gradient_state import GradientState

__all__ = ["AcceleratedOptimizer", "move_state_to_params", "switch_parameters"]


def switch_parameters(optimizer: torch.optim.Optimizer, moved: Dict[Any, Any]) -> None:
    """Point ``optimizer`` at the parameters its model got when it moved to the device (``old -> new``).

    Needed on XLA, where ``model.to(device)`` makes new Parameter objects, so an optimizer built before
    ``prepare`` (the usual order) would keep updating the CPU copies and the model would never learn.
    """
    for group in optimizer.param_groups:
        group["params"] = [moved.get(param, param) for param in group["params"]]
    entries = list(optimizer.state.items())  # the state is keyed by parameter too (a defaultdict)
    optimizer.state.clear()
    for param, value in entries:
        optimizer.state[moved.get(param, param)] = value


def move_state_to_params(optimizer: torch.optim.Optimizer) -> None:
    """Put the optimizer's state (e.g. Adam's moments loaded from a CPU checkpoint) on its params' devices.

    ``Optimizer.load_state_dict`` already casts every state tensor to its parameter's device and dtype
    (keeping ``step`` counters where torch wants them), so a round trip through it is the move.
    """
    needs_move = any(
        isinstance(value, torch.Tensor) and value.device != param.device and value.dim() > 0
        for param, state in optimizer.state.items()
        for value in state.values()
    )
    if needs_move:
        optimizer.load_state_dict(optimizer.state_dict())


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer; the training loop calls ``step()`` and ``zero_grad()`` exactly as before.

    - On gradient-accumulation steps (``accelerator.sync_gradients`` False) both are no-ops, so gradients
      keep adding up until the step that ends the cycle.
    - With fp16, ``step()`` goes through the GradScaler: gradients are unscaled (unless
      ``clip_grad_norm_`` already did), the step is skipped if they overflowed, and the scale is updated;
      ``step_was_skipped`` tells which happened.

    It subclasses :class:`torch.optim.Optimizer` only so that ``isinstance`` checks (LR schedulers) pass;
    all state lives in the wrapped ``optimizer``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_state: GradientState,
        scaler: Optional["torch.amp.GradScaler"] = None,
        *,
        xla_world: int = 0,
    ) -> None:
        # Deliberately no super().__init__(): param_groups/state/defaults are the wrapped optimizer's.
        self.optimizer = optimizer
        self.gradient_state = gradient_state
        self.scaler = scaler
        self.xla_world = xla_world  # > 1: the step first all-reduces gradients over XLA (no DDP there)
        self._step_was_skipped = False
        self._gradients_unscaled = False
        self._gradients_reduced = False
        # called once, after the first real step (the Accelerator's line of what a sharded rank holds)
        self.after_first_step: Optional[Callable[[], None]] = None
        # the Accelerator's time-limit watch (``time_limit.py``): told of every real step; the step boundary (the
        # next zero_grad() or step()) is where it makes the checkpoint the ranks agreed on
        self.after_each_step: Optional[Callable[[], None]] = None
        self.at_step_boundary: Optional[Callable[[], None]] = None

    # --- the wrapped optimizer's data, shared (not copied) so schedulers and users see one truth
    @property
    def state(self) -> Dict[Any, Any]:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Dict[Any, Any]) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: List[Dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> Dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: Dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        # an LR scheduler built on this wrapper patches `step` on the instance (to count calls); like
        # torch.optim.Optimizer.__getstate__, leave that closure out of the pickle
        state.pop("step", None)
        for callback in ("after_first_step", "after_each_step", "at_step_boundary"):  # the Accelerator's closures
            state[callback] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    # --- the training-loop API
    @property
    def step_was_skipped(self) -> bool:
        """True when the last ``step()`` did not update the weights (fp16 overflow)."""
        return self._step_was_skipped

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Clear gradients, except on accumulation steps (they are still being summed); ``set_to_none=None``: the
        optimizer's own default (torch's: True)."""
        self._boundary()
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(**({} if set_to_none is None else {"set_to_none": set_to_none}))

    def unscale_gradients(self) -> None:
        """Divide fp16-scaled gradients by the loss scale, once per step (before clipping them)."""
        if self.scaler is not None and not self._gradients_unscaled:
            self.scaler.unscale_(self.optimizer)
            self._gradients_unscaled = True

    def reduce_gradients(self) -> None:
        """On XLA: average the gradients over every device, once per step, with torch_xla's all-reduce (what
        ``xm.optimizer_step`` does before stepping; done early when the gradients are clipped first)."""
        if self.xla_world > 1 and not self._gradients_reduced:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(self.optimizer)
            self._gradients_reduced = True

    def _first_step_done(self) -> None:
        callback, self.after_first_step = self.after_first_step, None
        if callback is not None:
            callback()
        if self.after_each_step is not None:
            self.after_each_step()

    def _boundary(self) -> None:
        if self.at_step_boundary is not None:
            self.at_step_boundary()

    def train(self) -> None:
        """Put the wrapped optimizer in "train" mode (schedule-free optimizers have one; others: nothing)."""
        self._call_mode("train")

    def eval(self) -> None:
        """Put the wrapped optimizer in "eval" mode (schedule-free optimizers have one; others: nothing)."""
        self._call_mode("eval")

    def _call_mode(self, mode: str) -> None:
        inner = self.optimizer
        for candidate in (inner, getattr(inner, "optimizer", None)):  # DeepSpeed's wraps the user's one more time
            if callable(getattr(candidate, mode, None)):
                getattr(candidate, mode)()
                return

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        """Update the weights, unless this is an accumulation step or fp16 gradients overflowed."""
        self._boundary()
        if not self.gradient_state.sync_gradients:
            self._step_was_skipped = False  # nothing was attempted: not an overflow
            return None
        if self.xla_world > 1:
            self.reduce_gradients()
            self._gradients_reduced = False
        if self.scaler is None:
            self._step_was_skipped = False
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
            self._first_step_done()
            return result
        if closure is not None:
            raise ValueError("optimizer.step(closure) cannot be combined with fp16 loss scaling (GradScaler)")
        scale_before = self.scaler.get_scale()
        result = self.scaler.step(self.optimizer)  # unscales if clip_grad_norm_ did not; skips on inf/nan
        self.scaler.update()  # lowers the scale after an overflow, slowly raises it otherwise
        self._step_was_skipped = self.scaler.get_scale() < scale_before
        self._gradients_unscaled = False
        self._first_step_done()
        return result
