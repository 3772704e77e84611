"""A detached launch on Slurm, submitted: the job folder with the plan in it, and an ``sbatch`` of the driver.

The batch job asks what the launch's allocation would (``backends.slurm.allocation.job_request``: its nodes and tasks,
the ``slurm={...}`` options, ``--signal=USR2@N`` before a time limit, which reaches the ranks' step) and
``--requeue``: a job that reached its time limit, or was preempted, runs again from its checkpoint. Its script runs
``python -m notebook_accel.detached.slurm_driver <folder>`` with the kernel's Python and environment (``sbatch``
exports it), less the kernel's own Slurm job variables; the driver's output goes to ``<folder>/driver.log``.
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional

from ..backends.slurm.allocation import allocation_name, check_request, job_request
from ..backends.slurm.backend import job_name, site_of
from ..backends.slurm.tools import require_tools, run_tool
from ..errors import LaunchError
from ..plan.options import LaunchOptions
from ..plan.plan import LaunchPlan
from .attaching import DetachedJob
from .folder import JobFolder

TOOLS = ("sbatch", "srun", "squeue", "scancel", "scontrol")
SCRIPT, DRIVER_LOG = "batch.sh", "driver.log"
DRIVER_MODULE = "notebook_accel.detached.slurm_driver"


@dataclass
class DriverPlan:
    """What the driver needs to run the launch inside the batch job: the function and its arguments (pickled
    portably, as for a cluster's ranks) and the launch's options, made for the inside of the job."""

    payload: Any              # a ``wire.payload.PortablePayload``
    options: LaunchOptions


def submit(plan: LaunchPlan, options: LaunchOptions) -> DetachedJob:
    """Write the job folder, ``sbatch`` the driver, and return the job's handle (a ``LaunchError`` when Slurm refuses
    it; nothing is left behind then)."""
    require_tools(TOOLS)
    site = site_of(plan)
    check_request(site.request_options, site.num_nodes)
    folder = JobFolder.create("slurm", plan.function_name)
    try:
        folder.write_plan(DriverPlan(plan.payload.portable(), inside_the_job(plan, options)))
        script = os.path.join(folder.path, SCRIPT)
        with open(script, "w") as out:
            out.write(batch_script(folder.path))
        name = allocation_name(job_name(plan))
        argv = sbatch_command(site.request_options, site.num_nodes, site.ranks_per_node, name,
                              gpus=plan.device == "cuda", folder=folder.path)
        done = run_tool(argv, env=submission_environment())
        if done.returncode != 0:
            raise LaunchError(f"sbatch refused the detached launch: {done.stderr.strip() or done.returncode}")
        job = done.stdout.strip().split(";")[0]
        folder.update_record(slurm_job=job, slurm_name=name)
    except BaseException:
        folder.forget()
        raise
    return DetachedJob(folder)


def inside_the_job(plan: LaunchPlan, options: LaunchOptions) -> LaunchOptions:
    """The launch's options as the driver plans them inside the batch job: a step of it (no ``slurm`` request), the
    world and device the kernel planned, no display (the events go to the folder), not detached again."""
    return replace(options, detach=False, display="none", slurm=None, num_processes=plan.world_size,
                   num_nodes=site_of(plan).num_nodes, device=plan.device, pdb=False)


def sbatch_command(request: Mapping[str, str], num_nodes: int, ranks_per_node: int, name: str, *, gpus: bool,
                   folder: str) -> List[str]:
    """``sbatch`` of the folder's batch script.

    >>> sbatch_command({"time": "10"}, 2, 1, "notebook_accel:train.1a2b3c", gpus=False, folder="/j/1")
    ... # doctest: +NORMALIZE_WHITESPACE
    ['sbatch', '--parsable', '--requeue', '--open-mode=append', '--output=/j/1/driver.log', '--nodes=2',
     '--ntasks-per-node=1', '--job-name=notebook_accel:train.1a2b3c', '--time=10', '--signal=USR2@90', '/j/1/batch.sh']
    """
    return (["sbatch", "--parsable", "--requeue", "--open-mode=append", f"--output={os.path.join(folder, DRIVER_LOG)}"]
            + job_request(request, num_nodes, ranks_per_node, name, gpus) + [os.path.join(folder, SCRIPT)])


def batch_script(folder: str, python: str = sys.executable) -> str:
    """The batch job's script: the driver, in place of the shell (Slurm's SIGTERM reaches it)."""
    return f"#!/bin/sh\nexec {shlex.quote(python)} -u -m {DRIVER_MODULE} {shlex.quote(folder)}\n"


def submission_environment(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The kernel's environment without its own job's Slurm variables (a kernel inside an allocation): ``sbatch``
    exports the rest to the batch job, and would read ``SBATCH_*`` as options.

    >>> submission_environment({"SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_TIMELIMIT": "5", "A": "1"})
    {'SLURM_CONF': '/etc/slurm.conf', 'A': '1'}
    """
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if not name.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")) or name == "SLURM_CONF"}
