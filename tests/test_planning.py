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
    with pytest.raises(LaunchConfigError, match="not one of salloc's long options"):
        plan_launch(rank_function, num_processes=2, cluster="slurm", slurm={"zzzzzz": "1"})


def test_every_sbatch_long_option_is_taken(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    plan = plan_launch(rank_function, num_processes=2, cluster="slurm",
                       slurm={"partition": "debug", "time": "00:05:00", "account": "lab", "exclusive": True,
                              "mem-per-cpu": "1G", "qos": "normal", "constraint": "a100"})
    assert dict(plan.site.request)["time"] == "00:05:00"


# ------------------------------------------------------------------------------------------- the table

@pytest.mark.parametrize("options", [{"num_processes": 2, "device": "cpu", "start_method": "spawn"},
                                     {"num_processes": 2, "cluster": "ray"},
                                     {"num_processes": 2, "cluster": "slurm"}])
def test_make_plan_asks_the_planner_for_the_device_once_and_builds_one_plan(monkeypatch, options):
    from notebook_accel.plan import plan as plan_module
    from notebook_accel.plan.planners import PLANNERS

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    planner = PLANNERS[options.get("cluster")]
    asked, built = [], []
    devices = planner.devices
    monkeypatch.setattr(planner, "devices", lambda settings: asked.append(1) or devices(settings))
    plan_class = plan_module.LaunchPlan
    monkeypatch.setattr(plan_module, "LaunchPlan", lambda *a, **k: built.append(1) or plan_class(*a, **k))
    plan = plan_launch(rank_function, **options)
    assert (len(asked), len(built), plan.world_size) == (1, 1, 2)


def test_a_planner_row_registered_at_run_time_is_a_cluster_value(monkeypatch):
    """A new way of placing ranks is one more row: ``cluster`` takes its name, ``make_plan`` asks it."""
    from notebook_accel.plan.planner import Devices, Placed, Planner
    from notebook_accel.plan.planners import register, unregister
    from notebook_accel.plan.sites import LocalProcesses

    class Elsewhere(Planner):
        cluster = "elsewhere"
        refuses = ("num_nodes",)
        placed_by = "elsewhere places the ranks"

        def devices(self, options):
            return Devices("cpu", None)

        def place(self, options, devices, allow_inline):
            return Placed(LocalProcesses(start_method="spawn", master_addr="127.0.0.1", use_port=None),
                          options["num_processes"] or 1)

    register(Elsewhere())
    try:
        plan = plan_launch(rank_function, num_processes=3, cluster="elsewhere")
        assert (plan.world_size, plan.device, plan.backend) == (3, "cpu", "processes")
        with pytest.raises(LaunchConfigError, match="num_nodes=2 does not apply with cluster='elsewhere'"):
            plan_launch(rank_function, num_processes=2, num_nodes=2, cluster="elsewhere")
    finally:
        unregister("elsewhere")
    with pytest.raises(LaunchConfigError, match="cluster='elsewhere' is not one of"):
        plan_launch(rank_function, num_processes=3, cluster="elsewhere")


def test_a_saved_configs_node_options_are_a_launchers_never_a_sessions(tmp_path):
    """The options table says which entry points read a saved value (``Option.from_saved_config``): a config's
    ``num_nodes`` and rendezvous are torch elastic's, which ``notebook_launcher`` takes and a ``Session`` never does
    (it takes ``num_nodes`` only as given, where its cluster's planner takes it)."""
    import yaml

    from notebook_accel.plan.entry_points import resolve_options

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"num_processes": 2, "num_nodes": 2, "rdzv_endpoint": "h:1"}))
    launcher = resolve_options("notebook_launcher", {"config": str(path)})
    session = resolve_options("Session", {"config": str(path)})
    assert (launcher["num_nodes"], launcher["num_processes"]) == (2, 2)
    assert (session["num_nodes"], session["num_processes"]) == (1, 2)
    assert resolve_options("Session", {"config": str(path), "num_nodes": 2})["num_nodes"] == 2
