"""The Accelerator's process control, under HF accelerate's names: which rank runs what, and the ranks agreeing.

``split_between_processes`` (each rank its share of a list of prompts), the ``on_*`` decorators, ``set_trigger`` /
``check_trigger`` (one rank tells all to stop), ``no_sync`` and ``join_uneven_inputs`` (ranks with different
numbers of batches). A mixin of :class:`~.accelerator.Accelerator`: nothing here runs in a training step unless the
loop calls it.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, List, Optional, Sequence, TypeVar

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import IterableDataset

from . import operations
from .fsdp import is_sharded
from .partial_state import PartialState
from .sharding import BatchSamplerShard
from .state import DistributedType

__all__ = ["ProcessControl"]

F = TypeVar("F", bound=Callable[..., Any])


class ProcessControl:
    """Mixed into the Accelerator, which provides ``state``, ``device``, ``_data_loaders`` and ``reduce``."""

    state: Any
    device: torch.device
    _data_loaders: List[Any]
    _flag_tensor: Optional[torch.Tensor] = None

    def _partial_state(self) -> PartialState:
        return self.state  # an AcceleratorState: a PartialState

    @property
    def is_last_process(self) -> bool:
        """True on the last rank (``num_processes - 1``)."""
        return self.state.process_index == self.state.num_processes - 1

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This rank's contiguous share of ``inputs`` (list, tuple, tensor, or a dict of them) inside the block: the
        first ``len % num_processes`` ranks get one more; ``apply_padding`` repeats the last item so every rank has
        as many (then ``gather`` works; drop the repeats after).

        Example::

            with accelerator.split_between_processes(["A", "B", "C"]) as prompts:
                results = [generate(p) for p in prompts]          # rank 0 of 2: A, B; rank 1: C
            everything = gather_object(results)                    # A, B, C results, in order
        """
        with self._partial_state().split_between_processes(inputs, apply_padding=apply_padding) as mine:
            yield mine

    def on_main_process(self, function: Optional[F] = None) -> Any:
        """Decorator: ``function`` runs on the main process only (elsewhere the call returns None).

        Example::

            @accelerator.on_main_process
            def save_report(text): ...
        """
        return self._partial_state().on_main_process(function)

    def on_local_main_process(self, function: Optional[F] = None) -> Any:
        """Decorator: ``function`` runs on the first rank of each node only."""
        return self._partial_state().on_local_main_process(function)

    def on_last_process(self, function: F) -> F:
        """Decorator: ``function`` runs on the last rank only."""
        return self._partial_state().on_last_process(function)

    def on_process(self, function: Optional[F] = None, process_index: Optional[int] = None) -> Any:
        """Decorator: ``@accelerator.on_process(process_index=1)`` runs ``function`` on that rank only."""
        return self._partial_state().on_process(function, process_index=process_index)

    def on_local_process(self, function: Optional[F] = None, local_process_index: Optional[int] = None) -> Any:
        """Decorator: ``function`` runs on the rank of that local index on every node."""
        return self._partial_state().on_local_process(function, local_process_index=local_process_index)

    def set_trigger(self) -> None:
        """Raise this rank's flag; the next :meth:`check_trigger` on every rank returns True (no barrier needed).

        Example::

            if not torch.isfinite(loss):
                accelerator.set_trigger()
            if accelerator.check_trigger():      # every rank, same answer
                break
        """
        self._flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every rank if any rank called :meth:`set_trigger` since the last True (a collective: call it on
        every rank); the flags are then lowered."""
        flag = self._flag_tensor if self._flag_tensor is not None else torch.tensor(0, device=self.device)
        if int(operations.reduce(flag, "sum").item()) >= 1:
            self._flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Gradients computed in the block are not all-reduced (DDP's ``no_sync``; FSDP2: no reduce-scatter); the
        next backward outside it syncs the sum. Prefer :meth:`accumulate`, which does this for you."""
        if isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        elif is_sharded(model):
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        else:
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """The backward inside the block all-reduces the gradients even after forwards run under :meth:`no_sync`
        (HF's: several forwards, one synced backward). Models that are not DDP-wrapped: a plain block.

        Example::

            with accelerator.no_sync(model):
                loss_a = loss_fn(model(input_a)); loss_b = loss_fn(model(input_b))
            accelerator.backward(loss_a)                      # local only
            with accelerator.trigger_sync_in_backward(model):
                accelerator.backward(loss_b)                  # all-reduces the sum of both
        """
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])  # DDP's reducer expects this backward (torch's own no_sync exit)
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: Sequence[Any], even_batches: Optional[bool] = None) -> Iterator[None]:
        """Let ranks run different numbers of steps: torch's ``Join`` shadows the collectives of the ranks that ran
        out of batches (DDP models, ``ZeroRedundancyOptimizer``...). ``even_batches=False`` makes the prepared loaders
        stop padding the end of the epoch inside the block. Works on CPU (gloo) as on GPUs — HF accelerate turns it
        off but for GPUs.

        Example::

            with accelerator.join_uneven_inputs([model], even_batches=False):
                for x, y in loader:                 # rank 0 may get one batch more than rank 1
                    accelerator.backward(loss_fn(model(x), y)); optimizer.step(); optimizer.zero_grad()
        """
        if self.state.num_processes == 1 or self.state.distributed_type == DistributedType.XLA:
            if self.state.num_processes > 1:
                warnings.warn("join_uneven_inputs: torch's Join needs a torch.distributed group, which TPU cores "
                              "here do not use; it has no effect", stacklevel=3)  # fmt: skip
            yield
            return
        if self.state.distributed_type not in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
            warnings.warn(f"Joining uneven inputs is only supported for multi-GPU (and, here, multi-CPU) DDP training, "
                          f"not {self.state.distributed_type.value}: join_uneven_inputs has no effect",
                          stacklevel=3)  # fmt: skip
            yield
            return
        from torch.distributed.algorithms.join import Join

        if even_batches is not None and any(isinstance(getattr(loader, "dataset", None), IterableDataset)
                                            for loader in self._data_loaders):  # fmt: skip
            warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some dataloaders "
                          "given were iterable: their ends are not changed", stacklevel=3)  # fmt: skip
        shards = [shard for loader in self._data_loaders for shard in (loader.batch_sampler, loader.sampler)
                  if isinstance(shard, BatchSamplerShard)]  # fmt: skip
        before = [shard.even_batches for shard in shards]
        if even_batches is not None:
            for shard in shards:
                shard.even_batches = even_batches
        uneven = not all(shard.even_batches for shard in shards) if shards else even_batches is False
        try:
            with Join(list(joinables), enable=uneven, throw_on_early_termination=False):
                yield
        finally:
            for shard, value in zip(shards, before):
                shard.even_batches = value
