"""The suite's heavy things, made once per run (per xdist worker) and shared by every test file that needs them:

- ``real_hosts_pair``: two real hosts (``real_hosts.RealHosts(2)``) — the Ray nodes and torch-elastic nodes of
  test_real_hosts.py run in them, and so does the Slurm cluster;
- ``slurm``: one Slurm cluster on those hosts (two stand-in GPUs per node: test_slurm_session.py's binding needs
  them; a launch on CPU ranks asks for none), for test_slurm_cluster.py, test_slurm_launch.py, test_slurm_session.py;
- ``fake_ray``: one fake two-node Ray cluster (``ray_cluster.FakeCluster``: the head offers 2 "slot"s and runs Ray
  Client's server), for test_ray_cluster.py, test_ray_client.py (``fake_ray.client_address``),
  test_ray_checkpoints.py and test_ray_detached.py.

Session-scoped: each is torn down when the run ends, and checks then that nothing of it outlived it (the harnesses'
own ``close``/``shutdown``). To have one per run under pytest-xdist, the files that use one are pinned to one worker:
conftest.py gives each test file its own ``xdist_group`` (``--dist loadgroup`` then schedules by file, as
``loadfile`` did) and the files in ``SHARED_GROUPS`` one group together.
"""
from __future__ import annotations

import socket
from typing import Dict, Iterator

import pytest

# The files that share one of the fixtures below: one xdist group each, so that one worker makes it once.
SHARED_GROUPS: Dict[str, str] = {
    "test_real_hosts.py": "real-hosts",
    "test_slurm_cluster.py": "real-hosts",
    "test_slurm_launch.py": "real-hosts",
    "test_detached_slurm.py": "real-hosts",
    "test_slurm_session.py": "real-hosts",
    "test_sweep_slurm.py": "real-hosts",
    "test_time_limit_slurm.py": "real-hosts",
    "test_ray_client.py": "fake-ray",
    "test_ray_cluster.py": "fake-ray",
    "test_ray_checkpoints.py": "fake-ray",
    "test_ray_detached.py": "fake-ray",
    "test_attach_kernel.py": "fake-ray",
}


SHARED_FIXTURES = ("real_hosts_pair", "slurm", "fake_ray")


def xdist_group(filename: str) -> str:
    """The xdist group of a test file (its base name): its shared group, else the file itself."""
    return SHARED_GROUPS.get(filename, filename)


@pytest.fixture(scope="session")
def real_hosts_pair():
    """Two real hosts for the whole run; skipped where they cannot be made (not root, no ``ip``)."""
    from real_hosts import RealHosts, unavailable

    if unavailable() is not None:
        pytest.skip(unavailable())
    with RealHosts(2) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def slurm(real_hosts_pair):
    """One real Slurm cluster on ``real_hosts_pair`` for the whole run (two stand-in GPUs per node)."""
    import slurm_cluster
    from slurm_cluster import SlurmCluster

    if slurm_cluster.unavailable() is not None:
        pytest.skip(slurm_cluster.unavailable())
    with SlurmCluster(real_hosts_pair, gpus=2) as made:
        yield made


@pytest.fixture(scope="session")
def fake_ray() -> Iterator:
    """One fake two-node Ray cluster for the whole run, this process its driver; ``client_address`` is its head's Ray
    Client server (``ray://``). Only the Ray driver files use it, and they run last in their worker
    (``tiers.RAY_DRIVER_FILES``), so no later test of the worker forks ranks beside Ray's threads."""
    from ray_cluster import FakeCluster

    with socket.socket() as probe:  # a port free now, for the head's Ray Client server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = FakeCluster([{"num_cpus": 2, "resources": {"slot": 2}, "ray_client_server_port": port},
                           {"num_cpus": 2}])
    started.client_address = f"ray://127.0.0.1:{port}"
    try:
        yield started
    finally:
        started.shutdown()
