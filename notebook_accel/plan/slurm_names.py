"""Slurm's names, once: the long options a job is asked for with, and the variables a job and its steps set.

Everything else that knows Slurm reads them here: planning (``plan.slurm``) checks ``slurm={...}`` against
``ALLOCATION_OPTIONS`` and finds a job's GPUs from ``GPU_REQUEST_OPTIONS`` and ``GPU_VARIABLES``; the backend
(``backends.slurm``) asks for the job with them and leaves ``PER_TASK_GPU_VARIABLES`` out of its steps' environment.

>>> check_request({"partition": "gpu", "time": "01:00:00", "exclusive": True})
{'partition': 'gpu', 'time': '01:00:00', 'exclusive': ''}
>>> check_request({"tme": "01:00:00"})
Traceback (most recent call last):
...
notebook_accel.errors.LaunchConfigError: slurm={'tme': ...} is not one of salloc's long options; did you mean 'time'?
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ..errors import LaunchConfigError
from .options import closest

# The long options (without dashes) a job is asked for with: salloc's, which are sbatch's less those of a batch script
# (--array, --output, --wrap...), from Slurm 23.02's man pages, less those that only print (--help, --usage,
# --verbose, --quiet) or are salloc's terminal's (--bell, --x11, --immediate, --kill-command).
ALLOCATION_OPTIONS = frozenset((
    "account", "acctg-freq", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters", "comment",
    "constraint", "container", "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "exclude", "exclusive",
    "extra-node-info", "get-user-env", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket",
    "gpus-per-task", "gres", "gres-flags", "hint", "job-name", "licenses", "mail-type", "mail-user", "mcs-label",
    "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nice", "no-kill", "no-shell",
    "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "overcommit", "oversubscribe", "partition", "power", "prefer", "priority", "profile",
    "qos", "reboot", "reservation", "signal", "sockets-per-node", "spread-job", "switches", "thread-spec",
    "threads-per-core", "time", "time-min", "tmp", "uid", "use-min-nodes", "wait-all-nodes", "wckey",
))
# Options the launch sets itself from num_nodes and num_processes: given in ``slurm``, they would contradict them.
OWN_OPTIONS = ("nodes", "ntasks", "ntasks-per-node", "no-shell", "job-name")
# Options that ask a job for GPUs, the count in their value ("4", "a100:4"; ``gres`` only when it names "gpu"), in the
# order a count per node is looked for; given one, the user said how many, else a CUDA launch asks for one per rank.
GPU_REQUEST_OPTIONS = ("gpus-per-node", "gres", "gpus", "gpus-per-task", "gpus-per-socket")
# Where a job's GPUs are said inside it (the kernel's environment, first found wins).
GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
                 "SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_SOCKET", "SLURM_GPUS")
# Of those, the ones whose count is not per node (per job, per task, per socket) and the ones that list GPU indexes.
NOT_PER_NODE = ("gpus", "gpus-per-task", "gpus-per-socket", "SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_SOCKET",
                "SLURM_GPUS")
GPU_INDEX_LISTS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
# What salloc/sbatch put in the kernel's environment to bind GPUs per task (``--gpus-per-task``) or per socket, which
# srun takes as its own defaults. A rank then sees only its GPU, as index 0, while ``LOCAL_RANK`` (torchrun's rule,
# ``cuda:LOCAL_RANK``) points past it: "invalid device ordinal". The step asks per node instead.
PER_TASK_GPU_VARIABLES = ("SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_SOCKET", "SLURM_TRES_PER_TASK", "SLURM_GPU_BIND",
                          "SLURM_CPUS_PER_GPU", "SLURM_MEM_PER_GPU", "SLURM_GPUS", "SLURM_GPUS_PER_NODE")
# The kernel runs inside a job (a batchspawner notebook, salloc) when this is set; its node count.
JOB_ID = "SLURM_JOB_ID"
JOB_NODE_COUNT = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")


def check_request(request: Optional[Mapping[Any, Any]]) -> Dict[str, str]:
    """``slurm={...}`` as the long options to ask for the job with (a flag's value ""), each key checked against
    ``ALLOCATION_OPTIONS`` (with the option meant, when one is close) — before anything waits in the queue."""
    checked: Dict[str, str] = {}
    for key, value in (request or {}).items():
        if not isinstance(key, str) or not key or key.startswith("-"):
            raise LaunchConfigError(f"slurm={{{key!r}: ...}}: keys are salloc's long option names without dashes, "
                                    f"e.g. 'partition', 'time', 'account'")
        if key not in ALLOCATION_OPTIONS:
            meant = closest(key, sorted(ALLOCATION_OPTIONS))
            raise LaunchConfigError(f"slurm={{{key!r}: ...}} is not one of salloc's long options"
                                    + (f"; did you mean {meant!r}?" if meant else " (see man salloc)"))
        if key in OWN_OPTIONS:
            raise LaunchConfigError(f"slurm={{{key!r}: ...}} is set by the launch itself (num_nodes, "
                                    f"num_processes): leave it out")
        if value is None or value is False:
            raise LaunchConfigError(f"slurm={{{key!r}: {value!r}}}: give a value, or True for a flag")
        checked[key] = "" if value is True else str(value)
    return checked
