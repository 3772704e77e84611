"""A launch on Slurm (``cluster="slurm"``), checked before anything is asked of Slurm: how many nodes and ranks,
which allocation (the kernel's own, or one to ask for with ``slurm={...}``), and which of the local launch's options
make no sense there.

What the cluster itself allows (the partition, its time limit, its nodes) is asked of Slurm by the backend
(``backends.slurm``), still before anything waits in the queue.

>>> from .options import defaults
>>> options = {**defaults(), "cluster": "slurm", "num_processes": 4, "num_nodes": 2}
>>> slurm_allocation(options, environ={"SLURM_JOB_ID": "12", "SLURM_JOB_NUM_NODES": "2"})
SlurmAllocation(num_nodes=2, ranks_per_node=2, allocation='12', request=(), max_restarts=0)
>>> slurm_allocation({**options, "num_processes": 3}, environ={})
Traceback (most recent call last):
...
notebook_accel.errors.LaunchConfigError: num_processes=3 ranks cannot be spread evenly over num_nodes=2 nodes: give a multiple of 2

Where the job has GPUs (or the ``slurm`` options ask for them) the device is CUDA unless ``device`` says otherwise, and
``num_processes`` defaults to one rank per GPU: the login node, where the kernel often runs, has none to look at.

>>> slurm_device({"device": None, "slurm": None}, {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4"})
('cuda', 4)
>>> slurm_device({"device": None, "slurm": {"gres": "gpu:a100:2"}}, {})
('cuda', 2)
>>> slurm_device({"device": "cpu", "slurm": None}, {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4"})
('cpu', None)
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional, Tuple

from ..errors import LaunchConfigError
from ..wire.choices import Device, StartMethod
from .options import OPTIONS
from .sites import SlurmAllocation

# Options of a launch on this machine (or of nodes started by hand) that Slurm's placement replaces.
_NOT_ON_SLURM = ("master_addr", "use_port", "compile_cache", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                 "rdzv_conf", "resources_per_rank", "placement")


def slurm_allocation(options: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> SlurmAllocation:
    """The site of a launch on Slurm (``plan.sites.SlurmAllocation``) from every launch setting (resolved), or a
    clear ``LaunchConfigError``: the one place where ``cluster="slurm"`` becomes Slurm. ``environ``: the kernel's
    environment (``SLURM_JOB_ID`` says it runs inside an allocation)."""
    environ = os.environ if environ is None else environ
    for name in _NOT_ON_SLURM:
        if options[name] != OPTIONS[name].default:
            raise LaunchConfigError(f"{name}={options[name]!r} does not apply with cluster='slurm': Slurm places the "
                                    f"ranks and they meet at rank 0's node")
    if options["start_method"] != StartMethod.AUTO:
        raise LaunchConfigError(f"start_method={options['start_method']!r} does not apply with cluster='slurm': "
                                f"every rank is a task of a Slurm job step (a process srun starts)")
    device, gpus_per_node = slurm_device(options, environ)
    num_nodes = int(options["num_nodes"])
    num_processes = options["num_processes"]
    allocation = environ.get("SLURM_JOB_ID") or None
    nodes_here = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
    if allocation is not None and num_nodes == OPTIONS["num_nodes"].default and nodes_here > 1 and \
            (num_processes is None or num_processes % nodes_here == 0):
        num_nodes = nodes_here   # inside an allocation, by default its every node
    if num_processes is None:
        if device == Device.CUDA:
            if gpus_per_node is None:
                raise LaunchConfigError("cluster='slurm' with device='cuda': give num_processes, the number of ranks "
                                        "in all (one GPU each)")
            num_processes = gpus_per_node * num_nodes
        else:
            num_processes = num_nodes
    if num_processes % num_nodes:
        raise LaunchConfigError(f"num_processes={num_processes} ranks cannot be spread evenly over "
                                f"num_nodes={num_nodes} nodes: give a multiple of {num_nodes}")
    request = {str(key): _option_value(key, value) for key, value in (options["slurm"] or {}).items()}
    if allocation is not None:
        if request:
            raise LaunchConfigError(f"slurm={dict(options['slurm'])!r} asks for an allocation, but this kernel runs "
                                    f"inside one (SLURM_JOB_ID={allocation}): the ranks run as a step of it")
        if num_nodes > nodes_here:
            raise LaunchConfigError(f"num_nodes={num_nodes} is more than the {nodes_here} node(s) of this kernel's "
                                    f"Slurm allocation (job {allocation})")
    return SlurmAllocation(num_nodes=num_nodes, ranks_per_node=num_processes // num_nodes, allocation=allocation,
                           request=tuple(request.items()), max_restarts=int(options["max_restarts"]))


# Where a job's GPUs per node are said: inside it (the kernel's environment, first found wins), or in the request.
_GPUS_HERE = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_PER_TASK",
              "SLURM_GPUS")
_GPU_REQUEST = ("gpus-per-node", "gres", "gpus", "G", "gpus-per-task")
_NOT_PER_NODE = ("gpus", "G", "gpus-per-task", "SLURM_GPUS_PER_TASK", "SLURM_GPUS")   # per job or per task


def slurm_device(options: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> Tuple[str, Optional[int]]:
    """The ranks' device and the GPUs per node when known (see the module docstring)."""
    environ = os.environ if environ is None else environ
    device = options["device"]
    if device not in (None, Device.CPU, Device.CUDA):
        raise LaunchConfigError(f"device={device!r} is not supported with cluster='slurm' (cpu or cuda)")
    request = {str(key): str(value) for key, value in (options["slurm"] or {}).items()}
    if environ.get("SLURM_JOB_ID"):
        said = [(name, environ[name]) for name in _GPUS_HERE if environ.get(name)]
    else:
        said = [(name, request[name]) for name in _GPU_REQUEST if name in request]
    said = [(name, text) for name, text in said if name != "gres" or "gpu" in text]
    gpus = _gpu_count(*said[0]) if said else None
    if device is None:
        device = Device.CUDA if said and gpus != 0 else Device.CPU
    if device != Device.CUDA or gpus == 0 or (said and said[0][0] in _NOT_PER_NODE):
        gpus = None   # a count per job or per task is not one per node
    return str(device), gpus


def _gpu_count(name: str, text: str) -> Optional[int]:
    """GPUs per node in one of Slurm's ways of saying it: "4", "a100:4", "gpu:a100:4", "0,1,2,3" (indexes)."""
    if name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        return len([index for index in text.split(",") if index.strip()])
    found = re.search(r"(\d+)\s*$", text.split(",")[0])
    return int(found.group(1)) if found else None


def check_slurm_option(options: Mapping[str, Any]) -> None:
    """``slurm={...}`` without ``cluster="slurm"`` is a mistake worth naming."""
    if options["slurm"] is not None and options["cluster"] != "slurm":
        raise LaunchConfigError(f"slurm={dict(options['slurm'])!r} asks Slurm for an allocation: give "
                                f"cluster='slurm' too")


def _option_value(key: Any, value: Any) -> str:
    if not isinstance(key, str) or not key or key.startswith("-"):
        raise LaunchConfigError(f"slurm={{{key!r}: ...}}: keys are salloc's long option names without dashes, e.g. "
                                f"'partition', 'time', 'account'")
    if value is True:
        return ""
    if value is None or value is False:
        raise LaunchConfigError(f"slurm={{{key!r}: {value!r}}}: give a value, or True for a flag")
    return str(value)
