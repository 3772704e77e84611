"""The ``NOTEBOOK_ACCEL_*`` environment variables, once: what each does and its default, for the options reference.

Two kinds: those a user may set (read in the kernel or in the ranks: waits, memory pools, where the config file is)
and those the launcher sets in every rank for the code running there (the device, the precision). A variable the
package reads is listed here (``tests/test_options.py`` greps the package for them); the docs' options reference
shows this table (``scripts/docs_hooks.py``).

>>> [variable.name for variable in ENVIRONMENT_VARIABLES if variable.set_by_launcher]
['NOTEBOOK_ACCEL_DEVICE', 'NOTEBOOK_ACCEL_MIXED_PRECISION']
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class EnvironmentVariable:
    """One variable: its name, its default (as text; "" when unset means off), what it does, who sets it."""

    name: str
    default: str
    help: str
    set_by_launcher: bool = False
    internal: bool = False  # the package's own plumbing or the tests': listed, not for users


ENVIRONMENT_VARIABLES: Tuple[EnvironmentVariable, ...] = (
    EnvironmentVariable("NOTEBOOK_ACCEL_CONFIG_FILE", "$HF_HOME/notebook_accel/default_config.yaml",
                        "the file `notebook-accel config` writes and `config=True` reads."),
    EnvironmentVariable("NOTEBOOK_ACCEL_PEER_WAIT", "30",
                        "seconds a rank may have finished while its peers still run before the dashboard and the "
                        "text view name the peers and where each waits (a collective the finished rank left)."),
    EnvironmentVariable("NOTEBOOK_ACCEL_START_WAIT", "60",
                        "seconds a rank may take to start (to run its first line) before its row says so."),
    EnvironmentVariable("NOTEBOOK_ACCEL_EXIT_GRACE", "30",
                        "seconds a rank's non-daemon threads and atexit handlers get once its function returned; "
                        "those still running are then named on its stderr and the rank ends."),
    EnvironmentVariable("NOTEBOOK_ACCEL_RESULT_POOL_MIB", "1024",
                        "MiB of freed result memory a warm session's rank keeps for its next large result "
                        "(`Session.pull`, `run`'s return values); the rest goes back to the system."),
    EnvironmentVariable("NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB", "4",
                        "in ranks that shard a model on CPU: the block size from which glibc gives freed memory back "
                        "to the system at once (at most 32; `0` leaves glibc as it is)."),
    EnvironmentVariable("NOTEBOOK_ACCEL_WARM_START", "1",
                        "where the kernel has CUDA live (or torch's CUDA build and a GPU), `import notebook_accel` "
                        "starts the fork server in the background so the first launch finds it warm; `0` turns "
                        "that off."),
    EnvironmentVariable("NOTEBOOK_ACCEL_JOBS", "~/.notebook_accel/jobs",
                        "where detached launches keep their job folders (the record, events and result of each), "
                        "until `forget()`; it must be on a file system the cluster's nodes "
                        "share with the kernel's machine."),
    EnvironmentVariable("NOTEBOOK_ACCEL_SWEEP_DIR", "~/.notebook_accel/sweeps",
                        "where a `sweep` on Slurm from a login node keeps each trial's plan, events and ending while "
                        "its job array runs: a folder every node sees (removed when the sweep returns)."),
    EnvironmentVariable("NOTEBOOK_ACCEL_DEVICE", "",
                        "set in every rank: the launch's device (`cuda`, `cpu`, `xla`, `mps`), which `Accelerator()` "
                        "uses.", set_by_launcher=True),
    EnvironmentVariable("NOTEBOOK_ACCEL_MIXED_PRECISION", "",
                        "set in every rank: the launch's `mixed_precision` (as `ACCELERATE_MIXED_PRECISION`, which "
                        "HF accelerate reads too).", set_by_launcher=True),
    EnvironmentVariable("NOTEBOOK_ACCEL_DETACHED", "",
                        "set in a detached launch's ranks by its driver: SIGTERM (a preemption) is a warning there, "
                        "as SIGUSR2 is.", internal=True),
    EnvironmentVariable("NOTEBOOK_ACCEL_NETWORK", "",
                        "set by a launcher that chose a rank's network interface (several nodes): what the rank's "
                        "start-up info says of it.", internal=True),
    EnvironmentVariable("NOTEBOOK_ACCEL_SYSFS_ROOT", "/",
                        "where the TPU detection reads the PCI bus (the tests' fake sysfs).", internal=True),
    EnvironmentVariable("NOTEBOOK_ACCEL_FORKSERVER_OWNER", "",
                        "set by the launcher in its fork server: the kernel it belongs to.", internal=True),
)
