"""How a Slurm step ends and which job it runs in, without a cluster: each break fails here in seconds, naming what
broke (issue 44), where on the real cluster (test_slurm_launch.py) it would hang the kernel script.

The step is ``backends.slurm.step.SlurmStep`` — ``srun``'s relay — with the tests' own launcher in ``srun``'s place
(``relayed_local/launcher.py``: the real task module, one task per rank, its step "local.0") and a ``scancel`` on the
``PATH`` that records how it was called. A stopped, timed-out or failed launch ends its step with ``scancel`` of it
(every task, on every node: on a cluster, SIGTERM to ``srun`` alone leaves the tasks to Slurm's own timers, 5 to 12 s
here) and with SIGTERM to ``srun``'s process group.
"""
from __future__ import annotations

import os
import stat
import sys
import time

import pytest

from relayed_local import LAUNCHER

STARTED_WITHIN = 120.0   # s, for the tasks to say hello (a hang, not a speed, on a loaded machine)
ENDED_WITHIN = 10.0      # s from cancel to srun gone: it takes milliseconds; broken, it never ends


def recording_tool(tmp_path, monkeypatch, name: str, answer: str = ""):
    """A ``name`` first on the ``PATH`` that appends its arguments, a line per call, to a file, then runs the shell
    line ``answer`` (its output is the tool's; ``{calls}`` in it: that file). Returns the calls so far, as a
    function."""
    record = tmp_path / f"{name}.calls"
    tool = tmp_path / "bin" / name
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(f"#!/bin/sh\necho \"$*\" >> {record}\n{answer.replace('{calls}', str(record))}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    return lambda: record.read_text().splitlines() if record.exists() else []


@pytest.fixture
def scancel_calls(tmp_path, monkeypatch):
    """A ``scancel`` first on the ``PATH`` that records its calls (:func:`recording_tool`); the calls so far."""
    return recording_tool(tmp_path, monkeypatch, "scancel")


@pytest.fixture
def step():
    """A running step of two tasks, attached (the supervisor's handles fed), ended after the test."""
    from notebook_accel.backends.slurm.step import SlurmStep

    running = SlurmStep([sys.executable, "-u", LAUNCHER, "2"], 2)
    try:
        deadline = time.monotonic() + STARTED_WITHIN
        assert running.wait_ready(lambda: time.monotonic() > deadline, lambda: None), "the tasks did not say hello"
        assert running.step_id == "local.0"
        running.attach()
        yield running
    finally:
        running.end()


def _srun_ended(step, within: float) -> bool:
    try:
        step.launcher.wait(within)
        return True
    except Exception:
        return False


def test_cancel_scancels_the_step_and_ends_srun(step, scancel_calls):
    """``cancel`` (a Stop, a timeout, a kill past its grace) asks Slurm to end the step's every task, and ends
    ``srun``: both, each bounded here, with nothing else (stdin still open) to end the tasks."""
    step.cancel()
    assert scancel_calls() == ["--quiet local.0"], \
        f"a cancelled Slurm step was not scancelled (scancel calls: {scancel_calls()})"
    assert _srun_ended(step, ENDED_WITHIN), \
        f"srun still runs {ENDED_WITHIN:g} s after the step was cancelled: no SIGTERM to its process group"


def test_ending_a_step_whose_ranks_still_run_cancels_it(step, scancel_calls):
    """``end`` after a launch stopped, timed out or failed (ranks still alive): the step is cancelled — Slurm's
    tasks do not end with ``srun``'s stdin on a node whose task is stuck — then everything closed."""
    assert all(handle.process.is_alive() for handle in step.handles)
    started = time.monotonic()
    step.end()
    assert scancel_calls() == ["--quiet local.0"], \
        f"a stopped Slurm step whose ranks still ran ended without scancel (calls: {scancel_calls()})"
    assert step.launcher.returncode is not None
    assert time.monotonic() - started < ENDED_WITHIN, \
        f"the stopped step took {time.monotonic() - started:.1f} s to end (bound {ENDED_WITHIN:g} s)"


def test_a_launch_inside_an_allocation_runs_a_step_of_it_and_asks_for_no_job(monkeypatch):
    """Inside an allocation (the plan's ``allocation``: the kernel's ``SLURM_JOB_ID``), the step's job is the
    kernel's and ``srun`` says so; no ``salloc`` is built (on a cluster, a new job would pend behind the kernel's own
    for ever)."""
    from notebook_accel.backends.slurm import backend as slurm_backend
    from notebook_accel.plan.plan import LaunchPlan
    from notebook_accel.plan.sites import SlurmAllocation

    def no_new_job(*args, **kwargs):
        raise AssertionError(f"a launch inside allocation 7 asked Slurm for a new job: {args}")

    monkeypatch.setattr(slurm_backend, "Allocation", no_new_job)
    monkeypatch.setattr(slurm_backend, "salloc_command", no_new_job)
    plan = LaunchPlan("train", None, 4, "cpu", SlurmAllocation(2, 2, "7"), "no", None, False, "none")
    backend = slurm_backend.SlurmBackend(plan)
    job = backend.allocate(lambda: False, lambda: None, lambda text: None)
    assert job == "7", f"a launch inside allocation 7 runs its step in job {job!r}"
    assert backend.allocation is None
    argv = slurm_backend.srun_command(plan, job)
    assert "--jobid=7" in argv, f"srun of a launch inside allocation 7 does not name the job: {argv}"


class _NoTable:
    def show(self, trials):
        pass

    def changed(self, trials):
        pass


def test_a_sweep_whose_trials_ended_returns_only_once_squeue_lists_none_of_its_array(tmp_path, monkeypatch):
    """A task whose driver wrote its trial's ending is still listed for a moment (COMPLETING): under load, a sweep
    returned while ``squeue`` still listed task 35_3 (a full run beside ``stress``). The sweep now returns only once
    ``squeue`` lists none of its array. The ``squeue`` here lists 35_3 for its first three calls."""
    from notebook_accel.backends.slurm import array

    squeue_calls = recording_tool(tmp_path, monkeypatch, "squeue", "[ $(wc -l < {calls}) -le 3 ] && echo 35_3 || true")
    sweep = array.ArraySweep([], None, _NoTable())
    monkeypatch.setattr(sweep, "_submit", lambda: setattr(sweep, "array_id", "35"))
    monkeypatch.setattr(sweep, "_follow", lambda: None)   # every trial's ending read
    sweep.run()
    asked = squeue_calls()
    assert asked[:1] == ["-h -r -j 35 -o %i"] and len(asked) == 4, \
        f"the sweep returned while squeue still listed its array (squeue calls: {asked})"


def test_a_launch_returns_only_once_squeue_no_longer_lists_its_step(tmp_path, monkeypatch):
    """``srun`` ends before the controller drops its step from the queue (a failed launch's step was still listed
    right after it raised, once in a suite run): ending a step waits, bounded, until ``squeue`` stops listing it.
    The ``squeue`` here lists step 412.0 for its first three calls, as a controller still hearing from its nodes."""
    from notebook_accel.backends.slurm.step import wait_until_unlisted

    squeue_calls = recording_tool(tmp_path, monkeypatch, "squeue",
                                  "[ $(wc -l < {calls}) -le 3 ] && printf '412.0\\n412.extern\\n' || echo 412.extern")
    assert wait_until_unlisted("412.0", within=ENDED_WITHIN), "squeue still listed the step after the bound"
    asked = squeue_calls()
    assert asked[0] == "-h -s -j 412 -o %i" and len(asked) == 4, \
        f"the step's end did not wait until squeue stopped listing it (squeue calls: {asked})"
    assert wait_until_unlisted("local.0", within=ENDED_WITHIN) and len(squeue_calls()) == 4, \
        "a step id no controller knows was asked of squeue"
