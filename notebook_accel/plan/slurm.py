"""A launch on Slurm (``cluster="slurm"``), checked before anything is asked of Slurm: how many nodes and ranks,
which allocation (the kernel's own, or one to ask for with ``slurm={...}``), and which of the local launch's options
make no sense there.

What the cluster itself allows (the partition, its time limit, its nodes) is asked of Slurm by the backend
(``backends.slurm``), still before anything waits in the queue.

>>> from .options import defaults
>>> options = {**defaults(), "cluster": "slurm", "num_processes": 4, "num_nodes": 2}
>>> slurm_allocation(options, Devices("cpu", None), environ={"SLURM_JOB_ID": "12", "SLURM_JOB_NUM_NODES": "2"})
SlurmAllocation(num_nodes=2, ranks_per_node=2, allocation='12', request=(), max_restarts=0)
>>> slurm_allocation({**options, "num_processes": 3}, Devices("cpu", None), environ={})
Traceback (most recent call last):
...
notebook_accel.errors.LaunchConfigError: num_processes=3 ranks cannot be spread evenly over num_nodes=2 nodes: give a multiple of 2

Where the job has GPUs (or the ``slurm`` options ask for them) the device is CUDA unless ``device`` says otherwise, and
``num_processes`` defaults to one rank per GPU: the login node, where the kernel often runs, has none to look at.

>>> slurm_device({"device": None, "slurm": None}, {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4"})
Devices(kind='cuda', per_node=4)
>>> slurm_device({"device": None, "slurm": {"gres": "gpu:a100:2"}}, {})
Devices(kind='cuda', per_node=2)
>>> slurm_device({"device": "cpu", "slurm": None}, {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4"})
Devices(kind='cpu', per_node=None)
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

from ..errors import LaunchConfigError
from ..wire.choices import Device
from .options import OPTIONS
from .planner import Devices, Placed, Planner
from .sites import SlurmAllocation
from .slurm_names import (GPU_INDEX_LISTS, GPU_REQUEST_OPTIONS, GPU_VARIABLES, JOB_ID, JOB_NODE_COUNT, NOT_PER_NODE,
                          check_request)

class SlurmPlanner(Planner):
    """Every rank a task of one Slurm job step (``plan.planners``' row for ``cluster="slurm"``)."""

    cluster = "slurm"
    own = ("slurm",)
    own_means = "asks Slurm for an allocation"
    # Options of a launch on this machine (or of nodes started by hand) that Slurm's placement replaces.
    refuses = ("master_addr", "use_port", "compile_cache", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
               "rdzv_conf", "resources_per_rank", "placement")
    placed_by = "Slurm places the ranks and they meet at rank 0's node"
    detaches = True   # a batch job (``detached.slurm_submit``)
    rank_is = "a task of a Slurm job step (a process srun starts)"

    def devices(self, options: Mapping[str, Any]) -> Devices:
        return slurm_device(options)

    def place(self, options: Mapping[str, Any], devices: Devices, allow_inline: bool) -> Placed:
        site = slurm_allocation(options, devices)
        return Placed(site, site.world_size)


def slurm_allocation(options: Mapping[str, Any], devices: Devices,
                     environ: Optional[Mapping[str, str]] = None) -> SlurmAllocation:
    """The site of a launch on Slurm (``plan.sites.SlurmAllocation``) from every launch setting (resolved) and the
    device ``slurm_device`` found, or a clear ``LaunchConfigError``: the one place where ``cluster="slurm"`` becomes
    Slurm. ``environ``: the kernel's environment (``SLURM_JOB_ID`` says it runs inside an allocation)."""
    environ = os.environ if environ is None else environ
    device, gpus_per_node = devices.kind, devices.per_node
    num_nodes = int(options["num_nodes"])
    num_processes = options["num_processes"]
    # A detached launch is a batch job of its own even from inside an allocation: it outlives the kernel's job.
    allocation = None if options.get("detach") else (environ.get(JOB_ID) or None)
    nodes_here = int(next((environ[name] for name in JOB_NODE_COUNT if environ.get(name)), 1))
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
    request = check_request(options["slurm"])
    if allocation is not None:
        if request:
            raise LaunchConfigError(f"slurm={dict(options['slurm'])!r} asks for an allocation, but this kernel runs "
                                    f"inside one (SLURM_JOB_ID={allocation}): the ranks run as a step of it")
        if num_nodes > nodes_here:
            raise LaunchConfigError(f"num_nodes={num_nodes} is more than the {nodes_here} node(s) of this kernel's "
                                    f"Slurm allocation (job {allocation})")
    return SlurmAllocation(num_nodes=num_nodes, ranks_per_node=num_processes // num_nodes, allocation=allocation,
                           request=tuple(request.items()), max_restarts=int(options["max_restarts"]))


def slurm_device(options: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> Devices:
    """The ranks' device and the GPUs per node when known (see the module docstring)."""
    environ = os.environ if environ is None else environ
    device = options["device"]
    if device not in (None, Device.CPU, Device.CUDA):
        raise LaunchConfigError(f"device={device!r} is not supported with cluster='slurm' (cpu or cuda)")
    request = {str(key): str(value) for key, value in (options["slurm"] or {}).items()}
    if environ.get(JOB_ID):
        said = [(name, environ[name]) for name in GPU_VARIABLES if environ.get(name)]
    else:
        said = [(name, request[name]) for name in GPU_REQUEST_OPTIONS if name in request]
    said = [(name, text) for name, text in said if name != "gres" or "gpu" in text]
    gpus = _gpu_count(*said[0]) if said else None
    if device is None:
        device = Device.CUDA if said and gpus != 0 else Device.CPU
    if device != Device.CUDA or gpus == 0 or (said and said[0][0] in NOT_PER_NODE):
        gpus = None   # a count per job or per task is not one per node
    return Devices(str(device), gpus)


def _gpu_count(name: str, text: str) -> Optional[int]:
    """GPUs per node in one of Slurm's ways of saying it: "4", "a100:4", "gpu:a100:4", "0,1,2,3" (indexes)."""
    if name in GPU_INDEX_LISTS:
        return len([index for index in text.split(",") if index.strip()])
    found = re.search(r"(\d+)\s*$", text.split(",")[0])
    return int(found.group(1)) if found else None
