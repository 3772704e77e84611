"""HF accelerate's ``PartialState`` / ``AcceleratorState``: this rank's place in the launch, without an Accelerator.

Distributed-inference code reaches for them directly::

    state = PartialState()
    with state.split_between_processes(prompts) as mine:      # this rank's contiguous share
        results = [generate(prompt) for prompt in mine]

Both read :func:`~.state.resolve_process_state` (the process group is made once per process). As in HF accelerate
the state is shared: a ``PartialState()`` made after an ``Accelerator(cpu=True)`` is that Accelerator's state.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import os
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

from . import operations
from .state import DistributedType, ProcessState, destroy_process_group, resolve_process_state

__all__ = ["PartialState", "AcceleratorState", "split_between_processes", "remember_state"]

F = TypeVar("F", bound=Callable[..., Any])

# The state the last Accelerator (or PartialState) of this process resolved, with that process's id: a rank forked
# from a kernel that made an Accelerator must not take the kernel's one-process state for its own.
_shared: Optional[ProcessState] = None
_shared_pid = -1


def remember_state(state: ProcessState) -> None:
    """Make ``state`` the one later ``PartialState()`` calls return (the Accelerator calls this)."""
    global _shared, _shared_pid
    _shared, _shared_pid = state, os.getpid()


def _do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


def split_between_processes(state: ProcessState, inputs: Any, apply_padding: bool = False) -> Any:
    """This rank's contiguous share of ``inputs`` (a list, tuple, tensor, or dict of them), as HF accelerate cuts it:
    the first ``len % world`` ranks get one more; ``apply_padding`` repeats the last element so every rank has as many.
    """
    world, rank = state.num_processes, state.process_index
    if world == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {len(value) for value in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("All values in the dictionary must have the same length")
        length = lengths.pop() if lengths else 0
    else:
        length = len(inputs)
    per_rank, extras = divmod(length, world)
    start = rank * per_rank + min(rank, extras)
    end = start + per_rank + (1 if rank < extras else 0)
    target = per_rank + (1 if extras > 0 else 0)

    def cut(values: Any) -> Any:
        if isinstance(values, dict):
            return {key: cut(value) for key, value in values.items()}
        if isinstance(values, torch.Tensor):
            part = values[start:end]
            if apply_padding and len(part) < target:
                filler = values[-1:].expand((target - len(part),) + tuple(values.shape[1:]))
                part = torch.cat([part, filler])
            return part
        if isinstance(values, (list, tuple)):
            part = values[start:end]
            if apply_padding and len(part) < target:
                part = part + type(part)([values[-1]] * (target - len(part)))
            return part
        return values

    return cut(inputs)


class PartialState:
    """Rank, world and device of this process, and the process-control helpers (HF accelerate's names).

    Example::

        state = PartialState()
        if state.is_main_process: ...
        state.wait_for_everyone()
    """

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if _shared is None or _shared_pid != os.getpid() or cpu or kwargs:
            remember_state(resolve_process_state(cpu=cpu, init_kwargs=kwargs or None))
        assert _shared is not None
        self.state: ProcessState = _shared

    # -------------------------------------------------------------------------------------------- where am I
    @property
    def initialized(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def default_device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def backend(self) -> Optional[str]:
        return self.state.backend

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.process_index == self.state.num_processes - 1

    def set_device(self) -> None:
        """The device is set when the state is resolved (``torch.cuda.set_device``): nothing left to do."""

    # ------------------------------------------------------------------------------------------ control
    def wait_for_everyone(self) -> None:
        operations.barrier()

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This rank's share of ``inputs`` (see :func:`split_between_processes`) inside the block.

        Example::

            with PartialState().split_between_processes(["A", "B", "C"]) as mine:
                print(mine)        # rank 0 of 2: ['A', 'B'], rank 1: ['C']
        """
        yield split_between_processes(self.state, inputs, apply_padding=apply_padding)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leads: bool) -> Iterator[None]:
        if not leads:
            self.wait_for_everyone()
        try:
            yield
        finally:
            if leads:
                self.wait_for_everyone()

    def on_main_process(self, function: F) -> F:
        """``function`` runs on the main process; elsewhere the call does nothing and returns None."""
        return self._only_if(self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        return self._only_if(self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        return self._only_if(self.is_last_process, function)

    def on_process(self, function: Optional[F] = None, process_index: Optional[int] = None) -> Any:
        """``@state.on_process(process_index=1)``: ``function`` runs on that rank only."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(self.process_index == process_index, function)

    def on_local_process(self, function: Optional[F] = None, local_process_index: Optional[int] = None) -> Any:
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_if(self.local_process_index == local_process_index, function)

    def _only_if(self, runs_here: bool, function: F) -> F:
        if runs_here or not self.use_distributed:
            return function
        return functools.wraps(function)(_do_nothing)  # type: ignore[return-value]

    def destroy_process_group(self, group: Any = None) -> None:
        destroy_process_group()

    def __repr__(self) -> str:
        return (f"Distributed environment: {self.distributed_type.value}\nNum processes: {self.num_processes}\n"
                f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
                f"Device: {self.device}\n")


class AcceleratorState(PartialState):
    """:class:`PartialState` plus the precision (``mixed_precision``), as HF's ``AcceleratorState`` gives it."""

    def __init__(self, mixed_precision: Optional[str] = None, cpu: bool = False, **kwargs: Any) -> None:
        super().__init__(cpu=cpu, **{key: value for key, value in kwargs.items() if not key.endswith("_plugin")})
        from .precision import resolve_mixed_precision

        self._mixed_precision = resolve_mixed_precision(mixed_precision)

    @property
    def mixed_precision(self) -> str:
        return self._mixed_precision
