"""Functions HF code imports from ``accelerate.utils`` that :mod:`.operations` and :mod:`.rng` do not already offer
under HF's name and signature. :mod:`notebook_accel.utils` exports these with the rest."""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from . import operations

__all__ = [
    "gather_object",
    "broadcast_object_list",
    "reduce",
    "wait_for_everyone",
    "find_executable_batch_size",
    "should_reduce_batch_size",
    "release_memory",
    "clear_device_cache",
    "extract_model_from_parallel",
    "patch_environment",
    "recursively_apply",
]


def gather_object(object: Any) -> List[Any]:  # noqa: A002 - HF's parameter name
    """Every rank's list (or tuple) of picklable objects, concatenated in rank order (HF's ``gather_object``: each
    rank passes a list). One process: ``obj`` itself.

    Example::

        with accelerator.split_between_processes(prompts) as mine:
            answers = [generate(p) for p in mine]
        answers = gather_object(answers)            # every prompt's answer, in the prompts' order
    """
    if operations.world_size() == 1:
        return object
    return [item for contribution in operations.gather_object(object) for item in contribution]


def broadcast_object_list(object_list: List[Any], from_process: int = 0) -> List[Any]:
    """Rank ``from_process``'s list, in place on every rank (and returned)."""
    if operations.world_size() > 1:
        object_list[:] = operations.broadcast_object(list(object_list), src=from_process)
    return object_list


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Every tensor reduced over the ranks (HF's default here is "mean"; ``Accelerator.reduce``'s is "sum"), times
    ``scale``."""
    reduced = operations.reduce(tensor, reduction)
    return reduced if scale == 1.0 else operations.tree_map(lambda value: value * scale, reduced)


def wait_for_everyone() -> None:
    """A barrier over every rank (nothing with one process)."""
    operations.barrier()


def recursively_apply(func: Callable[..., Any], data: Any, *args: Any, test_type: Callable[[Any], bool] =
                      operations.is_tensor, error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """``func`` on every leaf of a nested batch that ``test_type`` accepts (tensors), containers kept."""
    if error_on_other_type:
        for path, leaf in operations.tree_leaves(data, is_leaf=test_type):
            if not test_type(leaf):
                raise TypeError(f"Unsupported types ({type(leaf)}) passed to `{func.__name__}` at {path or 'the top'}")
    return operations.tree_map(lambda leaf: func(leaf, *args, **kwargs), data, is_leaf=test_type)


_OOM_MESSAGES = (
    "CUDA out of memory.",  # CUDA OOM
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # CUDNN SNAFU
    "DefaultCPUAllocator: can't allocate memory",  # CPU OOM
    "FATAL ERROR :: MODULE:PT_DEVMEM",  # HPU
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True for an out-of-memory error (CUDA, cuDNN, the CPU allocator), after which a smaller batch may fit."""
    if isinstance(exception, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(exception, RuntimeError) and len(exception.args) == 1 and any(
        message in exception.args[0] for message in _OOM_MESSAGES)  # fmt: skip


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the CUDA caching allocator (and collect garbage first if asked)."""
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> List[None]:
    """``a, b = release_memory(a, b)``: drop the references, collect, empty the device cache."""
    objects_list = list(objects)
    for index in range(len(objects_list)):
        objects_list[index] = None
    clear_device_cache(garbage_collection=True)
    return objects_list  # type: ignore[return-value]


def find_executable_batch_size(function: Optional[Callable[..., Any]] = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Optional[Callable[[], int]] = None) -> Any:
    """Decorator: call ``function(batch_size, ...)`` with ``starting_batch_size``, and again with 90% of it after
    each out-of-memory error (``reduce_batch_size_fn`` to choose otherwise), until it runs (HF's rule).

    Example::

        @find_executable_batch_size(starting_batch_size=256)
        def train(batch_size):
            loader = DataLoader(dataset, batch_size=batch_size)
            ...

        train()        # no batch_size: the decorator passes it
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)  # fmt: skip
    batch_size = starting_batch_size
    if reduce_batch_size_fn is None:
        def reduce_batch_size_fn() -> int:
            nonlocal batch_size
            batch_size = int(batch_size * 0.9)
            return batch_size

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters.keys())
        if len(params) < (len(args) + 1):
            arg_str = ", ".join([f"{arg}={value}" for arg, value in zip(params[1:], args[1:])])
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. Remove this as "
                f"the decorator already does so: `{function.__name__}({arg_str})`"
            )
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                clear_device_cache(garbage_collection=True)
                batch_size = reduce_batch_size_fn()

    return decorator


def extract_model_from_parallel(model: torch.nn.Module, keep_fp32_wrapper: bool = True,
                                keep_torch_compile: bool = True, recursive: bool = False) -> torch.nn.Module:
    """The module inside DDP / ``torch.compile`` / DeepSpeed wrappers (see ``Accelerator.unwrap_model``);
    ``recursive=True`` also unwraps the submodules that are themselves wrapped (in place)."""
    from torch.nn.parallel import DistributedDataParallel

    from .precision import remove_autocast_from_forward

    while True:
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)) or (
                hasattr(model, "module") and type(model).__name__ == "DeepSpeedEngine"):  # fmt: skip
            model = model.module
        elif not keep_torch_compile and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            break
    if recursive:
        for name, child in list(model.named_children()):
            unwrapped = extract_model_from_parallel(child, keep_fp32_wrapper, keep_torch_compile, recursive=True)
            if unwrapped is not child:
                setattr(model, name, unwrapped)
    if not keep_fp32_wrapper:
        remove_autocast_from_forward(model)
    return model


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (upper-cased names) inside the block; the old values come back after it."""
    saved: Dict[str, Optional[str]] = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
