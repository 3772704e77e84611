"""Where a model must be before FSDP2 or DeepSpeed shards it: whole, on the CPU or on this rank's own device.

Sharding exists so that no device holds the whole model. A model already on another rank's GPU (``.to("cuda")``
before ``Accelerator()`` picked this rank's device puts every rank's copy on GPU 0), spread over devices by a
``device_map``, or on the meta device (no values to shard) would fail inside FSDP or DeepSpeed with a message
about their internals, or — worse — run after costing a whole copy where it hurts. ``prepare`` says so first.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch

__all__ = ["placement_problem", "check_model_placement"]


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def placement_problem(devices: Iterable[torch.device], rank_device: torch.device) -> Optional[str]:
    """What is wrong with a model whose tensors are on ``devices`` for sharding on ``rank_device``, or None.

    >>> placement_problem([torch.device("cuda:0")], torch.device("cuda:1"))[:24]
    'the model is on cuda:0, '
    """
    found = sorted({torch.device(device) for device in devices}, key=str)
    if any(device.type == "meta" for device in found):
        return ("the model has tensors on the meta device (no values yet): materialize it (load or initialize its "
                "weights) before prepare")
    if len(found) > 1:
        return (f"the model is spread over {', '.join(map(str, found))} (a device_map?): sharding needs the whole "
                "model on one device; build or load it without a device_map, on the CPU")
    if found and found[0].type != "cpu" and not _same_device(found[0], rank_device):
        return (f"the model is on {found[0]}, but this rank trains on {rank_device}: every rank's whole copy went "
                "there before sharding. Build the model on the CPU and let prepare move it (or move it to "
                "accelerator.device, after Accelerator() is created)")
    return None


def check_model_placement(model: torch.nn.Module, rank_device: torch.device, how: str) -> None:
    """A ``ValueError`` naming ``how`` ("FSDP2", "DeepSpeed ZeRO-3") when the model cannot be sharded from where
    it is; nothing when it is on the CPU or this rank's device."""
    tensors = list(model.parameters()) + list(model.buffers())
    problem = placement_problem((tensor.device for tensor in tensors), rank_device)
    if problem is None and len(set(getattr(model, "hf_device_map", {}).values())) > 1:
        problem = ("the model was loaded with a device_map over several devices: sharding needs the whole model "
                   "on one device; load it without a device_map")
    if problem is not None:
        raise ValueError(f"{how}: {problem}")
