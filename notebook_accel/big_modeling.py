"""HF accelerate's big-model entry points: ``init_empty_weights`` / ``init_on_device`` as HF documents them; the
dispatching and offloading ones refused by name, pointing to HF accelerate's big-model inference.

    with init_empty_weights():
        model = MyModel(config)          # parameters on the meta device: no memory, no init time

``Accelerator.init_module(empty_init=True)`` does the same under FSDP2, then shards and materializes the model.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, NoReturn, Optional

import torch

__all__ = ["init_empty_weights", "init_on_device", "REFUSED", "load_checkpoint_and_dispatch", "dispatch_model",
           "infer_auto_device_map", "cpu_offload", "cpu_offload_with_hook", "disk_offload",
           "load_checkpoint_in_model", "prepare_pippy"]  # fmt: skip


@contextlib.contextmanager
def init_empty_weights(include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Modules built in the block get their parameters (and buffers, with ``include_buffers``) on the meta device:
    shapes and dtypes only, no memory. ``include_buffers=None`` reads ``ACCELERATE_INIT_INCLUDE_BUFFERS``.

    Example::

        with init_empty_weights():
            model = torch.nn.Linear(100_000, 100_000)     # model.weight.device == device("meta")
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: torch.device, include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Modules built in the block register their parameters on ``device`` (and, with ``include_buffers``, every
    tensor made in the block is made there: torch's device context)."""
    if include_buffers is None:
        include_buffers = os.environ.get("ACCELERATE_INIT_INCLUDE_BUFFERS", "").lower() in ("1", "true", "yes", "on")
    if include_buffers:
        with torch.device(device):
            yield
        return
    register = torch.nn.Module.register_parameter

    def register_on_device(module: torch.nn.Module, name: str, param: Optional[torch.nn.Parameter]) -> None:
        register(module, name, param)
        if param is not None:
            registered = module._parameters[name]
            extra = dict(registered.__dict__, requires_grad=param.requires_grad)  # a Parameter subclass's fields
            module._parameters[name] = type(registered)(registered.to(device), **extra)

    torch.nn.Module.register_parameter = register_on_device  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


# name -> what it does in HF accelerate (each refused here)
REFUSED = {
    "load_checkpoint_and_dispatch": "loads a checkpoint into a model and spreads it over GPUs, CPU and disk",
    "dispatch_model": "spreads a model's layers over devices by a device_map",
    "infer_auto_device_map": "computes a device_map from the devices' free memory",
    "cpu_offload": "keeps a model's weights on the CPU and moves each layer to the GPU for its forward",
    "cpu_offload_with_hook": "offloads a model to the CPU between calls",
    "disk_offload": "keeps a model's weights on disk",
    "load_checkpoint_in_model": "loads a (sharded) checkpoint into a model by a device_map",
    "prepare_pippy": "wraps a model for pipeline-parallel inference",
}


def refuse_big_model(name: str) -> NoReturn:
    raise NotImplementedError(
        f"{name} ({REFUSED[name]}) is HF accelerate's big-model inference, which notebook_accel does not offer: "
        f"use HF's own (`from accelerate import {name}`; it runs in a notebook_launcher rank too), or train with "
        "FSDP2 (Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())) and init_empty_weights")


def _refused(name: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        refuse_big_model(name)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Refused: {REFUSED[name]} is HF accelerate's big-model inference (use HF's own)."
    return refused


load_checkpoint_and_dispatch = _refused("load_checkpoint_and_dispatch")
dispatch_model = _refused("dispatch_model")
infer_auto_device_map = _refused("infer_auto_device_map")
cpu_offload = _refused("cpu_offload")
cpu_offload_with_hook = _refused("cpu_offload_with_hook")
disk_offload = _refused("disk_offload")
load_checkpoint_in_model = _refused("load_checkpoint_in_model")
prepare_pippy = _refused("prepare_pippy")

