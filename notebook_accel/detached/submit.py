"""``start_launch(..., detach=True)``: hand the planned launch to its cluster's submitter, which returns a
``DetachedJob`` at once. One row per cluster that runs detached launches (``Planner.detaches`` says which)."""
from __future__ import annotations

import importlib
from typing import Any

from ..plan.options import LaunchOptions
from ..plan.plan import LaunchPlan
from .attaching import DetachedJob

# cluster -> the module whose ``submit(plan, options) -> DetachedJob`` starts the job
SUBMITTERS = {"slurm": "notebook_accel.detached.slurm_submit", "ray": "notebook_accel.backends.ray.detached"}


def submit_detached(plan: LaunchPlan, options: LaunchOptions) -> DetachedJob:
    """Start ``plan`` as a job of its cluster that outlives the kernel (its options were checked already)."""
    module: Any = importlib.import_module(SUBMITTERS[str(options.cluster)])
    return module.submit(plan, options)
