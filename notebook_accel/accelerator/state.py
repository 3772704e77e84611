"""Where this process sits in the launch: rank, world, device, and the process group.

Everything here is read once from the environment the launcher (or torchrun, or torch_xla) set up:

- ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` (torchrun's names; absent means one process),
- ``ACCELERATE_MIXED_PRECISION`` ("no" | "fp16" | "bf16"), read by :mod:`.precision`,
- ``ACCELERATE_USE_CPU`` ("true" forces the CPU, as HF accelerate reads it; so does the launcher's
  ``NOTEBOOK_ACCEL_DEVICE=cpu``).

The process group is created at most once per process and only when there is more than one rank: a
single process needs no group, and every collective in :mod:`.operations` is an identity then — except for
DeepSpeed's engine and FSDP2's CPU offload, which want one even alone: :func:`one_rank_group` makes it from an
in-process store (no port), and :func:`end_one_rank_group` ends it (an in-kernel run's group must not stay in the
kernel, where it would refuse every later forked launch).
"""
from __future__ import annotations

import enum
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from .operations import use_xla_collectives, xla_device

__all__ = ["DistributedType", "ProcessState", "resolve_process_state", "destroy_process_group", "xla_device",
           "one_rank_group", "end_one_rank_group"]

_one_rank_group: Optional[object] = None  # the default group one_rank_group made, while it is the default


class DistributedType(str, enum.Enum):
    """How the ranks of this launch talk to each other (compares equal to its string value)."""

    NO = "NO"  # one process: no process group at all
    MULTI_CPU = "MULTI_CPU"  # several processes on CPU, gloo
    MULTI_GPU = "MULTI_GPU"  # several processes, one CUDA device each, nccl
    XLA = "XLA"  # TPU cores through torch_xla, xla backend
    DEEPSPEED = "DEEPSPEED"  # Accelerator.distributed_type with a DeepSpeed plugin on several processes
    FSDP = "FSDP"  # Accelerator.distributed_type with an FSDP2 plugin on several processes
    # HF accelerate's other kinds, never ours: there so that HF code comparing with them runs (and is False)
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


@dataclass(frozen=True)
class ProcessState:
    """This rank's place in the launch; immutable once resolved."""

    process_index: int
    local_process_index: int
    num_processes: int
    local_num_processes: int
    device: torch.device
    distributed_type: DistributedType
    backend: Optional[str]  # None when there is no process group

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    return int(value) if value.strip() else default


def _env_flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _xla_is_usable(environ: Mapping[str, str]) -> bool:
    """True when the launcher started this rank on XLA (``NOTEBOOK_ACCEL_DEVICE=xla``: a TPU, or torch_xla's
    CPU client), or torch_xla is installed *and* drives a TPU (an installed torch_xla on a CPU box is not)."""
    if environ.get("NOTEBOOK_ACCEL_DEVICE") == "xla":
        return True
    if importlib.util.find_spec("torch_xla") is None:
        return False
    try:
        import torch_xla.runtime as xr

        return xr.device_type() == "TPU"
    except Exception:  # a broken or device-less torch_xla install: behave as if absent
        return False


def _cuda_device(local_rank: int, local_world: int) -> torch.device:
    count = torch.cuda.device_count()
    if local_world > count:
        raise RuntimeError(
            f"{local_world} processes on this node but only {count} CUDA device(s) are visible; NCCL needs one "
            f"device per process. Launch at most {count} process(es), or pass Accelerator(cpu=True)."
        )
    # set_device first: NCCL and torch.cuda's "current device" must agree before the group is made.
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def resolve_process_state(
    cpu: bool = False, environ: Optional[Mapping[str, str]] = None, init_kwargs: Optional[Mapping[str, Any]] = None
) -> ProcessState:
    """Read the launch environment, pick the device and create the process group if needed (once).

    ``init_kwargs``: more arguments for ``init_process_group`` (``timeout``, ``backend``: an
    ``InitProcessGroupKwargs``'s), used only when this call creates the group.

    Example::

        state = resolve_process_state()
        state.device, state.process_index, state.num_processes   # cpu, 0, 1 outside any launcher
    """
    environ = os.environ if environ is None else environ
    # the launcher's device="cpu" arrives as both of these (HF accelerate reads the first)
    cpu = cpu or _env_flag(environ, "ACCELERATE_USE_CPU") or environ.get("NOTEBOOK_ACCEL_DEVICE") == "cpu"

    if not cpu and _xla_is_usable(environ):
        return _resolve_xla_state()

    rank = _env_int(environ, "RANK", 0)
    world = _env_int(environ, "WORLD_SIZE", 1)
    local_rank = _env_int(environ, "LOCAL_RANK", rank)
    local_world = _env_int(environ, "LOCAL_WORLD_SIZE", world)
    if dist.is_available() and dist.is_initialized():
        # Someone (the user, or an earlier Accelerator) already made the group: it is the truth.
        rank, world = dist.get_rank(), dist.get_world_size()

    if not cpu and torch.cuda.is_available():
        device = _cuda_device(local_rank, local_world)
        backend, kind = "nccl", DistributedType.MULTI_GPU
    elif not cpu and world == 1 and torch.backends.mps.is_available():
        device, backend, kind = torch.device("mps"), None, DistributedType.NO
    else:
        device, backend, kind = torch.device("cpu"), "gloo", DistributedType.MULTI_CPU

    if world == 1:
        return ProcessState(0, 0, 1, 1, device, DistributedType.NO, None)

    if not dist.is_initialized():
        # env:// rendezvous: MASTER_ADDR/MASTER_PORT come from the launcher (which may host the store
        # itself and set TORCHELASTIC_USE_AGENT_STORE, exactly as torchrun's agent does).
        extra = {name: value for name, value in (init_kwargs or {}).items() if value is not None}
        backend = extra.pop("backend", backend)
        dist.init_process_group(backend=backend, rank=rank, world_size=world, **extra)
    else:
        backend = dist.get_backend()
    return ProcessState(rank, local_rank, world, local_world, device, kind, backend)


def _resolve_xla_state() -> ProcessState:
    """TPU cores: torch_xla's runtime knows the ranks (a rank is a device: a thread of a worker process on
    v2/v3 and on the CPU client, a whole process elsewhere). No torch.distributed group: it would be one per
    process, not per device thread; collectives go through torch_xla's own (see ``operations``)."""
    import torch_xla.runtime as xr

    device = xla_device()  # first: it binds this thread to its device, which the ordinals below read
    rank, world = xr.global_ordinal(), xr.world_size()
    local_rank = xr.local_ordinal()
    local_world = xr.local_process_count() * xr.addressable_device_count()
    use_xla_collectives()
    kind = DistributedType.XLA
    return ProcessState(rank, local_rank, world, max(local_world, 1), device, kind, "xla" if world > 1 else None)


def one_rank_group(device: torch.device) -> bool:
    """Make a process group of this process alone, if none exists (True when made here): what DeepSpeed's engine
    and FSDP2 need even for one rank, as HF accelerate's ``deepspeed.init_distributed()`` gives them. Its store is
    in this process (``HashStore``): no port is held, no peer is waited for. nccl on a GPU, gloo otherwise."""
    global _one_rank_group
    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    _one_rank_group = dist.group.WORLD
    return True


def end_one_rank_group() -> None:
    """Destroy the group :func:`one_rank_group` made, if it is still the default one (nothing else's)."""
    global _one_rank_group
    made, _one_rank_group = _one_rank_group, None
    if made is not None and dist.is_initialized() and dist.group.WORLD is made:
        dist.destroy_process_group()
        _forget_deepspeeds_groups()


def _forget_deepspeeds_groups() -> None:
    """DeepSpeed keeps the groups it made from the default one (its world and data-parallel groups) in module
    globals: once the default group is gone they name nothing, and a next engine in this process — or in a rank
    forked from it, which inherits them — fails ("Group ... is not registered"). Its own teardown releases them."""
    import sys

    groups = sys.modules.get("deepspeed.utils.groups")
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(None)
    elif groups is not None:  # a DeepSpeed before that function: the same globals, by hand
        for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "mpu"):
            if hasattr(groups, name):
                setattr(groups, name, None)


def destroy_process_group() -> None:
    """Destroy the default process group if there is one (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        _forget_deepspeeds_groups()
