"""``cluster="ray"`` and its options, checked before anything connects: no cluster is started here.

What needs a cluster (placement, output, failures, sessions, restarts) is ``test_ray_cluster.py``'s.
"""
from __future__ import annotations

import re
import sys

import pytest

from notebook_accel import Session, notebook_launcher, start_launch
from notebook_accel.errors import LaunchConfigError, LaunchConfigTypeError
from notebook_accel.plan.plan import plan_launch

INSTALL = 'pip install "notebook_accel[ray]"'


@pytest.fixture
def no_ray(monkeypatch):
    """Ray cannot be imported (``import ray`` raises ImportError), as where it is not installed."""
    monkeypatch.setitem(sys.modules, "ray", None)


@pytest.mark.parametrize("entry", ["notebook_launcher", "start_launch", "Session"])
def test_cluster_ray_without_ray_says_how_to_install_it(no_ray, entry):
    call = {"notebook_launcher": lambda: notebook_launcher(print, num_processes=1, cluster="ray", display="none"),
            "start_launch": lambda: start_launch(print, num_processes=1, cluster="ray", display="none"),
            "Session": lambda: Session(num_processes=1, cluster="ray", display="none")}[entry]
    with pytest.raises(LaunchConfigError, match=re.escape(INSTALL)) as refused:
        call()
    assert str(refused.value).startswith(f"{entry}: cluster='ray' needs Ray")


@pytest.mark.parametrize("options, said", [
    ({"resources_per_rank": {"CPU": 1}}, "resources_per_rank={'CPU': 1} places ranks on a cluster: give cluster='ray'"),
    ({"placement": "SPREAD"}, "placement='SPREAD' places ranks on a cluster: give cluster='ray' too"),
    ({"cluster": "ray", "use_port": 29500}, "use_port=29500 does not apply with cluster='ray'"),
    ({"cluster": "ray", "master_addr": "10.0.0.1"}, "master_addr='10.0.0.1' does not apply with cluster='ray'"),
    ({"cluster": "ray", "num_nodes": 2}, "num_nodes=2 does not apply with cluster='ray'"),
    ({"cluster": "ray", "start_method": "spawn"}, "start_method='spawn' does not apply with cluster='ray'"),
    ({"cluster": "ray", "device": "xla"}, "device='xla' is not supported with cluster='ray'"),
    ({"cluster": "ray", "device": "cuda", "resources_per_rank": {"CPU": 4}}, "needs a GPU per rank"),
    ({"cluster": "ray", "resources_per_rank": {"CPU": 0}}, "reserves nothing"),
    ({"cluster": "ray", "mixed_precision": "fp16"}, "mixed_precision='fp16' needs CUDA"),
    ({"cluster": "ray", "resources_per_rank": {"CPU": -1}}, "resources_per_rank must be a mapping of resource names"),
    ({"cluster": "ray", "placement": "EVERYWHERE"}, "placement='EVERYWHERE' is not one of 'PACK', 'SPREAD'"),
    ({"cluster": "k8s"}, "cluster='k8s' is not one of 'ray'"),
])
def test_cluster_options_that_contradict_each_other_are_refused_before_ray_is_imported(no_ray, options, said):
    with pytest.raises(LaunchConfigError, match=re.escape(said)):
        notebook_launcher(print, num_processes=2, display="none", **options)


def test_a_cluster_plan_reserves_a_cpu_or_a_gpu_per_rank_and_gives_each_rank_its_cpus_as_threads():
    plan = plan_launch(print, num_processes=4, cluster="ray")
    assert (plan.backend, plan.device, plan.world_size) == ("ray", "cpu", 4)
    assert plan.site.resources_per_rank == {"CPU": 1.0} and plan.site.placement == "PACK"
    gpus = plan_launch(print, num_processes=8, cluster="ray", device="cuda")
    assert gpus.site.resources_per_rank == {"CPU": 1.0, "GPU": 1.0}
    asked = plan_launch(print, num_processes=2, cluster="ray", resources_per_rank={"GPU": 1, "CPU": 4},
                        placement="STRICT_SPREAD", max_restarts=2)
    assert asked.device == "cuda"  # a GPU per rank: the ranks use it
    assert (asked.site.placement, asked.site.max_restarts, asked.threads_per_rank()) == ("STRICT_SPREAD", 2, 4)
    with pytest.raises(LaunchConfigError, match="give num_processes"):
        plan_launch(print, cluster="ray", device="cuda")
    with pytest.raises(LaunchConfigTypeError, match="resources_per_rank must be"):
        plan_launch(print, num_processes=1, cluster="ray", resources_per_rank=[("CPU", 1)])


def test_ray_is_an_extra_and_the_tests_install_it():
    from importlib.metadata import requires

    needs = requires("notebook_accel") or []
    assert any(need.startswith("ray") and 'extra == "ray"' in need for need in needs), needs
    assert any(need.startswith("ray") and 'extra == "test"' in need for need in needs), needs
