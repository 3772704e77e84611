"""Every test file's tier, in one table: ``pytest -m unit`` (about a minute) while you work, ``pytest -q`` (all but
``xla``) before you push, as CI does. conftest.py marks each test with its file's tier and refuses a test file that
is not in this table, so a new file cannot be left out of its tier.

  unit     in pytest's own process: no rank, no kernel, no browser (a few seconds of subprocesses at most)
  ranks    real rank processes on this machine (launches, sessions, scripts, nodes), gloo on CPU
  cluster  ranks on a cluster: Ray (a fake cluster, a local Ray, Ray nodes on real hosts) and Slurm on real hosts
  kernel   real Jupyter kernels (nbclient, the notebooks under nbval, the installed wheel)
  browser  JupyterLab driven in headless Chromium
  xla      the real torch_xla 2.9 CPU client, in a venv of its own (scripts/test_xla_cpu.sh; not in ``pytest -q``)
"""
from __future__ import annotations

import re
from typing import Dict, Optional

TIERS = ("unit", "ranks", "cluster", "kernel", "browser", "xla")

# Files whose tests make pytest's own process a Ray driver (a fake cluster's ``ray.init``). Ray's threads stay in
# the process after ``ray.shutdown()``, and a fork launch is then refused ("Ray's threads run in this process"): a
# later test of the same worker that forks its ranks failed so (8 tests of test_promises_stop.py in one suite run).
# They run last: conftest.py sorts them there (for a run in one process), and tests/suite_schedule.py hands them to a
# worker as its last work (they are in shared_clusters.SHARED_GROUPS, whose groups it runs last).
RAY_DRIVER_FILES = frozenset({"test_ray_cluster.py", "test_ray_client.py", "test_ray_checkpoints.py",
                              "test_ray_detached.py", "test_attach_kernel.py"})

FILES: Dict[str, str] = {
    "test_accelerator_units.py": "unit",
    "test_accelerate_names.py": "unit",     # HF accelerate's import paths and signatures vs ours (inspect)
    "test_dashboard.py": "unit",
    "test_dashboard_debug.py": "unit",
    "test_docs.py": "unit",          # and one mkdocs build, a subprocess of some seconds
    "test_doctests.py": "unit",
    "test_options.py": "unit",
    "test_outcome.py": "unit",
    "test_planning.py": "unit",
    "test_progress.py": "unit",
    "test_slurm_units.py": "unit",      # Slurm commands the kernel runs, recorded (no cluster)
    "test_slurm_stdio_writes.py": "unit",  # what a warm run writes to srun's stdio, write by write (no cluster)
    "test_detached_units.py": "unit",   # a detached job's folder: its event log, ending, attach replaying it
    "test_notebook_helpers.py": "unit",  # helpers the notebooks define (ray_cluster.ipynb's start retry)
    "test_rank_network.py": "unit",
    "test_promises_gpu.py": "unit",
    "test_structure.py": "unit",
    "test_suite_schedule.py": "unit",   # the suite's own scheduler's choices (tests/suite_schedule.py)

    "test_accelerator_distributed.py": "ranks",
    "test_accelerate_parity.py": "ranks",   # HF accelerate's Accelerator and ours, same snippets, 2 CPU ranks each
    "test_hf_test_scripts.py": "ranks",     # HF accelerate's own test scripts, check by check, on HF's and on ours
    "test_hf_examples.py": "ranks",         # HF accelerate's example scripts (vendored), on HF's and on ours
    "test_dispatch_batches.py": "ranks",    # prepare_data_loader(dispatch_batches=True): rank 0 reads for everyone
    "test_backend_contract.py": "ranks",
    "test_cli.py": "ranks",
    "test_cuda_machine.py": "ranks",    # a real GPU (skipped without one)
    "test_cuda_payload.py": "ranks",
    "test_cuda_stand_in.py": "ranks",
    "test_warm_start.py": "ranks",       # the fork server started at import where CUDA is live (the stand-in)
    "test_debugging.py": "ranks",
    "test_deepspeed.py": "ranks",
    "test_fsdp.py": "ranks",
    "test_sharded_memory.py": "ranks",
    "test_launcher.py": "ranks",
    "test_sweep.py": "ranks",           # many launches from one call: one per config, N at a time
    "test_launcher_errors.py": "ranks",
    "test_launcher_signals.py": "ranks",
    "test_nodes.py": "ranks",
    "test_output_drain.py": "ranks",
    "test_pdb_terminal.py": "ranks",
    "test_promises_cli.py": "ranks",
    "test_promises_config.py": "ranks",
    "test_promises_nodes.py": "ranks",
    "test_promises_stop.py": "ranks",
    "test_ray_options.py": "ranks",
    "test_rank_imports.py": "ranks",
    "test_session.py": "ranks",
    "test_session_xla.py": "ranks",
    "test_sharding_config.py": "ranks",
    "test_shared_results.py": "ranks",
    "test_torchrun_ranks.py": "ranks",
    "test_time_limit.py": "ranks",      # SIGUSR2 before a time limit: agreed checkpoint, TimeLimitReached, resume
    "test_xla_detection.py": "ranks",
    "test_xla_launch.py": "ranks",

    "test_ray_cluster.py": "cluster",      # Ray actors on a fake two-node ray.cluster_utils.Cluster
    "test_ray_checkpoints.py": "cluster",  # Ray: a lost rank resumed from the latest checkpoint; SIGUSR2 on actors
    "test_attach_kernel.py": "cluster",     # Ray + 2 real kernels: one detaches a launch, another attaches to it
    "test_ray_detached.py": "cluster",     # Ray: a detached launch outlives its kernel; attach, cancel, forget
    "test_real_hosts.py": "cluster",       # network namespaces on a bridge: Ray nodes and torch-elastic nodes per host
    "test_slurm_cluster.py": "cluster",    # a real Slurm cluster: slurmctld here, a slurmd per network namespace
    "test_time_limit_slurm.py": "cluster",  # a real 1-minute time limit: warned, checkpointed, resumed
    "test_slurm_launch.py": "cluster",     # cluster="slurm" on that cluster: a step of the kernel's allocation
    "test_detached_slurm.py": "cluster",   # detached batch jobs: kernel killed, attach, cancel, forget, requeue
    "test_sweep_slurm.py": "cluster",      # sweep(cluster="slurm"): one job array, N tasks at a time
    "test_slurm_session.py": "cluster",    # a Session in a job of its own; pdb in a rank on another node
    "test_slurm_step.py": "unit",          # a Slurm step's end (a recorded scancel) and job, with a local launcher
    "test_ray_local.py": "cluster",        # a script whose launch starts a local Ray (no ray.init() of its own)
    "test_ray_client.py": "cluster",       # a script reaching the fake cluster only through ray:// (Ray Client)

    "test_dashboard_debug_kernel.py": "kernel",
    "test_dashboard_kernel.py": "kernel",
    "test_entry_points.py": "kernel",
    "test_install.py": "kernel",
    "test_kernel.py": "kernel",
    "test_panel.py": "kernel",
    "test_pdb_kernel.py": "kernel",
    "test_readme.py": "kernel",
    "test_session_kernel.py": "kernel",
    "test_stack_dumps_kernel.py": "kernel",
    "test_xla_notebook.py": "kernel",
    "*.ipynb": "kernel",   # notebooks/, run cell by cell by nbval

    "test_browser_dashboard.py": "browser",

    "test_xla_real.py": "xla",
}


def tier_of(filename: str) -> Optional[str]:
    """The tier of a test file (its base name), None if it has none."""
    if filename.endswith(".ipynb"):
        return FILES["*.ipynb"]
    return FILES.get(filename)


def selects(markexpr: str, tier: str) -> Optional[bool]:
    """Whether ``pytest -m markexpr`` can select a test of ``tier``; None when the expression names more than
    tiers (then only the tests' own markers can tell). Its names are all tiers here, so ``eval`` sees only
    ``and``, ``or``, ``not``, parentheses and booleans."""
    names = set(re.findall(r"[A-Za-z_]\w*", markexpr)) - {"and", "or", "not"}
    if not names or not names <= set(TIERS) or re.search(r"[^\w\s()]", markexpr):
        return None
    try:
        return bool(eval(markexpr, {"__builtins__": {}}, {name: name == tier for name in names}))
    except SyntaxError:  # pytest says what is wrong with it
        return None
