"""Slurm's own commands, found and run: the backend drives Slurm only through them (``srun``, ``salloc``, ``squeue``,
``scancel``, ``sinfo``, ``scontrol``), as a user at the login node would.

>>> missing_tools(["sh"], which=lambda name: None)
['sh']
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Callable, List, Mapping, Optional, Sequence

from ...errors import LaunchConfigError

TOOL_TIMEOUT = 60.0   # s a query of the controller may take (a busy controller answers slowly, not never)


def missing_tools(names: Sequence[str], which: Callable[[str], Optional[str]] = shutil.which) -> List[str]:
    """The commands of ``names`` that are not on the ``PATH``."""
    return [name for name in names if which(name) is None]


def require_tools(names: Sequence[str]) -> None:
    """A clear ``LaunchConfigError`` naming every missing Slurm command."""
    missing = missing_tools(names)
    if missing:
        raise LaunchConfigError(
            f"cluster='slurm' needs Slurm's commands, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not on this machine's PATH. Run the notebook on a Slurm login "
            f"node or inside a job (JupyterHub's batchspawner, Open OnDemand), or install Slurm's client commands "
            f"(Debian/Ubuntu: apt-get install slurm-client) with the cluster's slurm.conf and munge key")


def run_tool(argv: Sequence[str], timeout: float = TOOL_TIMEOUT,
             env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """A Slurm command, its output as text (never raises for its exit code: the caller reads it)."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else dict(env))
