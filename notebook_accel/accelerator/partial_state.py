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
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar

import torch

from . import operations
from .state import DistributedType, ProcessState, destroy_process_group, resolve_process_state

__all__ = ["PartialState", "AcceleratorState", "split_between_processes", "remember_state"]

F = TypeVar("F", bound=Callable[..., Any])



def remember_state(state: ProcessState) -> None:
    """Make ``state`` the one later ``PartialState()`` calls share (the Accelerator calls this)."""
    PartialState._adopt(state)


def _do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


def split_between_processes(state: Any, inputs: Any, apply_padding: bool = False) -> Any:
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

    # HF's design (a "Borg"): every instance shares one __dict__, so ``state.debug = True`` or
    # ``state.distributed_type = ...`` on one is seen by all. A new dict (never a cleared one) replaces it when the
    # state is re-resolved, so objects that hold the old one (an earlier Accelerator) keep working.
    _shared_state: Dict[str, Any] = {}

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if PartialState._shared_state.get("_pid") != os.getpid() or cpu or kwargs:
            PartialState._adopt(resolve_process_state(cpu=cpu, init_kwargs=kwargs or None))
        self.__dict__ = PartialState._shared_state

    @staticmethod
    def _adopt(process: ProcessState) -> Dict[str, Any]:
        """Share ``process`` (a resolved :class:`~.state.ProcessState`) from now on; returns the new shared dict."""
        PartialState._shared_state = _fields_of(process)
        return PartialState._shared_state

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (HF's tests and notebooks call it before building a second Accelerator): the
        next ``PartialState()`` reads the launch again. As HF's, the instances made before are emptied (reading
        them raises :meth:`__getattr__`'s message). The process group stays: it is made once per process."""
        PartialState._shared_state.clear()

    def __getattr__(self, name: str) -> Any:
        # only reached for a name the (shared) instance dict lacks: after _reset_state, say so as HF does
        if name in _FIELDS:
            raise AttributeError(f"`{type(self).__name__}` object has no attribute `{name}`. This happens if "
                                 f"`{type(self).__name__}._reset_state()` was called and an `Accelerator` or "
                                 "`PartialState` was not reinitialized.")  # fmt: skip
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    # -------------------------------------------------------------------------------------------- where am I
    @property
    def state(self) -> ProcessState:
        """The resolved :class:`~.state.ProcessState` (ours; HF has no such attribute)."""
        return self._process

    @property
    def initialized(self) -> bool:
        return "_process" in self.__dict__

    @property
    def default_device(self) -> torch.device:
        return self.device

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

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
        yield split_between_processes(self, inputs, apply_padding=apply_padding)

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

    def on_main_process(self, function: Optional[F] = None) -> Any:
        """``function`` runs on the main process; elsewhere the call does nothing and returns None."""
        if function is None:
            return self.on_main_process
        return self._only_if(self.is_main_process, function)

    def on_local_main_process(self, function: Optional[F] = None) -> Any:
        if function is None:
            return self.on_local_main_process
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
        """As HF's: ``group`` if given, else the default group — which stays when ``FORK_LAUNCHED`` is set (HF's
        ``notebook_launcher`` sets it in the ranks it forks: a script's ``end_training()`` there must leave the
        launcher's group; ours does not set it, so under ours the group ends with the training, as under torchrun)."""
        if group is not None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group(group)
        elif not self.__dict__.get("fork_launched", _flag_from_environment("FORK_LAUNCHED")):  # after _reset_state too
            destroy_process_group()

    def __repr__(self) -> str:
        return (f"Distributed environment: {self.distributed_type.value}\nNum processes: {self.num_processes}\n"
                f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
                f"Device: {self.device}\n")


# the attributes every state has once resolved (a read of one after _reset_state gets HF's message)
_FIELDS = frozenset({"_process", "process_index", "local_process_index", "num_processes", "local_num_processes",
                     "device", "distributed_type", "backend", "debug", "fork_launched", "_mixed_precision",
                     "deepspeed_plugin", "fsdp_plugin", "dynamo_plugin"})  # fmt: skip


def _fields_of(process: ProcessState) -> Dict[str, Any]:
    """The shared dict of a state: the resolved process's fields as plain (assignable) attributes, and HF's
    ``debug`` (``ACCELERATE_DEBUG_MODE``: collectives first check that the ranks' shapes agree)."""
    return {"_process": process, "_pid": os.getpid(), "process_index": process.process_index,
            "local_process_index": process.local_process_index, "num_processes": process.num_processes,
            "local_num_processes": process.local_num_processes, "device": process.device,
            "distributed_type": process.distributed_type, "backend": process.backend,
            "debug": os.environ.get("ACCELERATE_DEBUG_MODE", "").lower() in ("1", "true", "yes", "on"),
            "fork_launched": _flag_from_environment("FORK_LAUNCHED")}  # fmt: skip


def _flag_from_environment(name: str) -> bool:
    """HF's ``parse_flag_from_env``: yes/true/on/1 (any case) is set; unset or anything else is not."""
    return os.environ.get(name, "").strip().lower() in ("y", "yes", "t", "true", "on", "1")


class AcceleratorState(PartialState):
    """:class:`PartialState` plus what the Accelerator chose: ``mixed_precision``, ``deepspeed_plugin``,
    ``fsdp_plugin``, ``dynamo_plugin`` (HF's ``AcceleratorState``). ``Accelerator().state`` is one; a later
    ``AcceleratorState()`` in the same process shares it, until :meth:`_reset_state`."""

    _shared_state: Dict[str, Any] = {}

    def __init__(self, mixed_precision: Optional[str] = None, cpu: bool = False, dynamo_plugin: Any = None,
                 deepspeed_plugin: Any = None, fsdp_plugin: Any = None, torch_tp_plugin: Any = None,
                 megatron_lm_plugin: Any = None, parallelism_config: Any = None, _from_accelerator: bool = False,
                 **kwargs: Any) -> None:  # fmt: skip
        from .absent import ABSENT_PARAMETERS, refuse_name

        for name, given in (("torch_tp_plugin", torch_tp_plugin), ("megatron_lm_plugin", megatron_lm_plugin),
                            ("parallelism_config", parallelism_config)):  # fmt: skip
            if given is not None:
                refuse_name(f"AcceleratorState({name}=...)", ABSENT_PARAMETERS[name])
        shared = AcceleratorState._shared_state
        fresh = (shared.get("_pid") != os.getpid() or cpu or kwargs or mixed_precision is not None
                 or _from_accelerator or any(plugin is not None for plugin in (dynamo_plugin, deepspeed_plugin,
                                                                              fsdp_plugin)))  # fmt: skip
        if fresh:
            from .precision import resolve_mixed_precision

            partial = PartialState(cpu=cpu, **kwargs)
            shared = AcceleratorState._shared_state = dict(partial.__dict__)
            shared.update(_mixed_precision=resolve_mixed_precision(mixed_precision), dynamo_plugin=dynamo_plugin,
                          deepspeed_plugin=deepspeed_plugin, fsdp_plugin=fsdp_plugin, megatron_lm_plugin=None,
                          torch_tp_plugin=None, parallelism_config=None, deepspeed_plugins=None)  # fmt: skip
        self.__dict__ = shared

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the shared state (and with ``reset_partial_state`` PartialState's too), as HF's does: the
        Accelerator that held it must not be used any more (a new ``Accelerator()`` makes a new state)."""
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    @property
    def mixed_precision(self) -> str:
        return self._mixed_precision

    @property
    def is_fsdp2(self) -> bool:
        return self.fsdp_plugin is not None

    def get_deepspeed_plugin(self, name: str) -> Any:
        """HF's lookup among several named DeepSpeed plugins: refused (one plugin here: ``deepspeed_plugin``)."""
        from .absent import ABSENT_PARAMETERS, refuse_name

        refuse_name("AcceleratorState.get_deepspeed_plugin(name)", ABSENT_PARAMETERS["deepspeed_plugins"])

    def select_deepspeed_plugin(self, name: Optional[str] = None) -> None:
        from .absent import ABSENT_PARAMETERS, refuse_name

        refuse_name("AcceleratorState.select_deepspeed_plugin", ABSENT_PARAMETERS["deepspeed_plugins"])
