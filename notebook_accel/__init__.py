"""notebook_accel: train a plain PyTorch loop on every device you have, from a notebook cell.

    from notebook_accel import notebook_launcher, Accelerator, progress

    def train(lr):
        accelerator = Accelerator()
        ...
        return accelerator.unwrap_model(model).state_dict()

    state = notebook_launcher(train, args=(3e-4,), num_processes=2)

Public names are imported lazily so that a rank (or ``import notebook_accel`` in a script) pays only for
what it uses: the launcher does not import torch or ipywidgets until it needs them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "notebook_launcher": ".launcher",
    "start_launch": ".launcher",
    "last_launch": ".launcher",
    "Launch": ".launcher",
    "LaunchError": ".errors",
    "LaunchTimeout": ".errors",
    "TimeLimitReached": ".errors",
    "LaunchConfigError": ".errors",
    "LaunchConfigTypeError": ".errors",
    "Accelerator": ".accelerator",
    "FullyShardedDataParallelPlugin": ".accelerator",
    "DeepSpeedPlugin": ".accelerator",
    "PartialState": ".accelerator",
    "AcceleratorState": ".accelerator",
    # the rest of HF accelerate's top level (``from accelerate import ...``), under the same names
    "DistributedType": ".accelerator.state",
    "AutocastKwargs": ".accelerator.configs",
    "DataLoaderConfiguration": ".accelerator.configs",
    "DDPCommunicationHookType": ".accelerator.configs",
    "DistributedDataParallelKwargs": ".accelerator.configs",
    "GradScalerKwargs": ".accelerator.configs",
    "InitProcessGroupKwargs": ".accelerator.configs",
    "ProfileKwargs": ".accelerator.configs",
    "ParallelismConfig": ".accelerator.configs",
    "find_executable_batch_size": ".accelerator.utilities",
    "skip_first_batches": ".data_loader",
    "debug_launcher": ".launchers",
    "synchronize_rng_states": ".utils.random",
    "is_rich_available": ".utils.imports",
    "init_empty_weights": ".big_modeling",
    "init_on_device": ".big_modeling",
    "load_checkpoint_and_dispatch": ".big_modeling",
    "load_checkpoint_in_model": ".big_modeling",
    "dispatch_model": ".big_modeling",
    "infer_auto_device_map": ".big_modeling",
    "cpu_offload": ".big_modeling",
    "cpu_offload_with_hook": ".big_modeling",
    "disk_offload": ".big_modeling",
    "prepare_pippy": ".big_modeling",
    "report": ".rank.metrics",
    "launch_panel": ".panel",
    "progress": ".rank.progress",
    "write_basic_config": ".plan.config",
    "Session": ".session",
    "last_session": ".session",
    "sweep": ".sweeps",
    "last_sweep": ".sweeps",
    "Sweep": ".sweeps",
    "attach": ".detached.attaching",
    "DetachedJob": ".detached.attaching",
    "detached_jobs": ".detached.attaching",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .accelerator import Accelerator, AcceleratorState, DeepSpeedPlugin, FullyShardedDataParallelPlugin, PartialState
    from .errors import LaunchConfigError, LaunchConfigTypeError, LaunchError, LaunchTimeout, TimeLimitReached
    from .launcher import Launch, last_launch, notebook_launcher, start_launch
    from .panel import launch_panel
    from .plan.config import write_basic_config
    from .session import Session, last_session
    from .sweeps import Sweep, last_sweep, sweep
    from .detached.attaching import DetachedJob, attach, detached_jobs
    from .rank.metrics import report
    from .rank.progress import progress


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_accel``: the ``%%ranks`` cell magic (runs a cell on every rank of a ``Session``)."""
    from .magics import load_ipython_extension as load

    load(ipython)
    _warm_start_where_cuda_is_live()


def _warm_start_where_cuda_is_live() -> None:
    """Where the kernel has CUDA live (or torch's CUDA build imported, and a GPU), start the fork server in the
    background now, so the first launch finds it warm (``backends.processes.warm_start``, which checks again and
    says why). Here only what costs nothing: the environment, ``sys.modules``, and whether a CUDA driver library
    is mapped; elsewhere (a CPU machine, a rank, the fork server itself) nothing is imported or started."""
    import sys

    from .process_role import is_kernel_process, warm_start_switched_off

    if warm_start_switched_off() or not is_kernel_process():   # a rank, a spawned child, the fork server itself
        return
    torch = sys.modules.get("torch")
    cuda_build = torch is not None and bool(getattr(getattr(torch, "backends", None), "cuda", None)
                                            and torch.backends.cuda.is_built())
    if not cuda_build:
        try:  # a CUDA driver another library initialised (or the test suite's stand-in)
            with open("/proc/self/maps") as maps:
                if not any("/libcuda.so" in line for line in maps):
                    return
        except OSError:
            return
    import threading

    def start() -> None:
        from .backends.processes.warm_start import maybe_start

        maybe_start(in_this_thread=True)

    threading.Thread(target=start, name="notebook_accel-warm-start", daemon=True).start()


_warm_start_where_cuda_is_live()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'notebook_accel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
