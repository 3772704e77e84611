"""Planning as a table (issue 43): one planner per way of placing ranks (``plan.planners.PLANNERS``), one
``LaunchPlan`` made in one place with the device asked once, and Slurm's option names checked before anything queues.
Everything here runs in pytest's own process: no rank starts."""
from __future__ import annotations

import pytest

from notebook_accel.errors import LaunchConfigError
from notebook_accel.plan.plan import plan_launch


def rank_function():
    return 1


# ------------------------------------------------------------------------------------------- Slurm's names

def test_gpus_per_socket_makes_the_plan_ask_for_cuda_as_the_job_asks_for_gpus(monkeypatch):
    """``slurm={"gpus-per-socket": ...}`` asks the job for GPUs (``backends.slurm.allocation``): the plan must pick
    CUDA with it, as it does with every other GPU request option."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    plan = plan_launch(rank_function, num_processes=2, cluster="slurm", slurm={"gpus-per-socket": 1})
    assert plan.device == "cuda"


def test_the_gpu_request_names_are_one_list():
    from notebook_accel.backends.slurm.allocation import asks_for_gpus
    from notebook_accel.plan.slurm_names import GPU_REQUEST_OPTIONS

    assert all(asks_for_gpus({name: "gpu:1" if name == "gres" else "1"}) for name in GPU_REQUEST_OPTIONS)


@pytest.mark.parametrize("key, meant", [("tme", "time"), ("partiton", "partition"), ("acount", "account")])
def test_a_misspelled_slurm_key_is_refused_with_the_option_meant(monkeypatch, key, meant):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LaunchConfigError, match=f"slurm={{'{key}': ...}}.*did you mean '{meant}'"):
        plan_launch(rank_function, num_processes=2, cluster="slurm", slurm={key: "1"})


def test_a_slurm_key_that_is_no_option_at_all_is_refused(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LaunchConfigError, match="not one of sbatch's long options"):
        plan_launch(rank_function, num_processes=2, cluster="slurm", slurm={"zzzzzz": "1"})


def test_every_sbatch_long_option_is_taken(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    plan = plan_launch(rank_function, num_processes=2, cluster="slurm",
                       slurm={"partition": "debug", "time": "00:05:00", "account": "lab", "exclusive": True,
                              "mem-per-cpu": "1G", "qos": "normal", "constraint": "a100"})
    assert dict(plan.site.request)["time"] == "00:05:00"
