"""HF accelerate's debug mode for collectives: ``ACCELERATE_DEBUG_MODE=1`` (or ``PartialState().debug = True``).

Then, before a gather, reduce, broadcast or pad, the ranks first exchange the shapes they are about to send, and
every rank raises the same :class:`DistributedOperationException` naming each rank's shapes when they differ —
instead of a hang or a garbled result inside the collective. Off (the default), it costs nothing.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List, TypeVar

import torch

from . import operations

__all__ = ["DistributedOperationException", "verify_operation", "check_same_shapes", "gather", "reduce", "broadcast",
           "pad_across_processes"]

F = TypeVar("F", bound=Callable[..., Any])


class DistributedOperationException(Exception):
    """A collective's inputs do not agree between the ranks (HF's name; raised only in debug mode)."""


def _debugging() -> bool:
    from .partial_state import PartialState

    state = PartialState()
    return bool(getattr(state, "debug", False)) and state.num_processes > 1


def _shapes(tree: Any, only_ndim: bool) -> List[Any]:
    return [(name, tensor.dim() if only_ndim else list(tensor.shape))
            for name, tensor in operations.tree_leaves(tree) if isinstance(tensor, torch.Tensor)]  # fmt: skip


def check_same_shapes(operation: str, tree: Any, only_ndim: bool = False) -> None:
    """Raise :class:`DistributedOperationException` on every rank when the ranks' shapes differ (their number
    of dimensions only, with ``only_ndim``: a pad's sizes may differ), or a tensor is not on this rank's device."""
    from .partial_state import PartialState

    device = PartialState().device
    for name, tensor in operations.tree_leaves(tree):
        if isinstance(tensor, torch.Tensor) and tensor.device.type != device.type:
            raise DistributedOperationException(
                f"One or more of the tensors passed to {operation} were not on the {tensor.device.type} while the "
                f"`Accelerator` is configured for {device.type}. Please move it to the {device.type} before calling "
                f"{operation}.")  # fmt: skip
    everyone = operations.gather_object(_shapes(tree, only_ndim))
    if any(shapes != everyone[0] for shapes in everyone):
        listing = "\n  - ".join(f"Process {rank}: {shapes}" for rank, shapes in enumerate(everyone))
        raise DistributedOperationException(
            "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
            f"\n\nOperation: `{operation}`\nInput shapes:\n  - {listing}")  # fmt: skip


def verify_operation(operation: str, only_ndim: bool = False) -> Callable[[F], F]:
    """Decorate a collective whose first argument is the tree it sends: checked first in debug mode."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if _debugging():
                tree = args[0] if args else kwargs.get("tensor", kwargs.get("input_data"))
                check_same_shapes(operation, tree, only_ndim)
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


# the collectives, checked in debug mode (the Accelerator's and notebook_accel.utils' call these)
gather = verify_operation("gather")(operations.gather)
reduce = verify_operation("reduce")(operations.reduce)
broadcast = verify_operation("broadcast")(operations.broadcast)
pad_across_processes = verify_operation("pad_across_processes", only_ndim=True)(operations.pad_across_processes)
