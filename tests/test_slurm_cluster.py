"""The Slurm cluster the Slurm backend's tests run on (``slurm_cluster``): real slurmctld, slurmd and munge, each node
a network namespace with its own address. Proven here before anything of ours uses it: ``srun`` places tasks on both
nodes, ``sbatch`` runs a job, and closing leaves nothing behind — even when the test inside failed."""
from __future__ import annotations

import os
import psutil
import pytest

import slurm_cluster
from slurm_cluster import SlurmCluster
from waiting import wait_until

pytestmark = pytest.mark.skipif(slurm_cluster.unavailable() is not None,
                                reason=slurm_cluster.unavailable() or "")


@pytest.fixture
def cluster(slurm):
    """The run's one Slurm cluster (``shared_clusters.slurm``)."""
    return slurm


def test_srun_places_tasks_on_both_nodes_from_the_login_node(cluster):
    listed = cluster.run(["srun", "-N2", "-n4", "-l", "sh", "-c",
                          "echo $SLURMD_NODENAME $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID"], timeout=60)
    assert listed.returncode == 0, listed.stderr + cluster.logs()
    tasks = sorted(line.split(":", 1)[1].split() for line in listed.stdout.splitlines())
    assert tasks == [[cluster.nodes[0], "0", "0", "0"], [cluster.nodes[0], "1", "0", "1"],
                     [cluster.nodes[1], "2", "1", "0"], [cluster.nodes[1], "3", "1", "1"]]
    # Each task runs in its node's namespace: it has that node's address and no other.
    addresses = cluster.run(["srun", "-N2", "-n2", "-l", "ip", "-4", "-o", "addr", "show", "scope", "global"],
                            timeout=60)
    by_task = {line.split(":", 1)[0].strip(): line for line in addresses.stdout.splitlines()}
    assert cluster.hosts.address(0) in by_task["0"] and cluster.hosts.address(1) not in by_task["0"]
    assert cluster.hosts.address(1) in by_task["1"]
    assert cluster.wait_no_jobs() == []


def test_sbatch_runs_a_job(cluster, tmp_path):
    out = tmp_path / "job.out"
    submitted = cluster.run(["sbatch", "--parsable", "-N2", "-n2", "-o", str(out), "--wrap", "srun -l hostname"])
    assert submitted.returncode == 0, submitted.stderr + cluster.logs()
    assert submitted.stdout.strip().isdigit()
    assert cluster.wait_no_jobs(timeout=120) == [], cluster.logs()
    assert sorted(line.split(":")[0] for line in out.read_text().splitlines()) == ["0", "1"]


def test_closing_ends_every_daemon_and_step_even_after_a_failure(cluster):
    """A test that fails inside a cluster: every daemon, the running job's slurmstepd and its task are gone after the
    ``with``, and the cluster's directory removed. (A second cluster on the run's hosts: ``RealHosts`` itself, the
    namespaces' end, is the hosts harness's own to test.)"""
    hosts = cluster.hosts
    before = set(hosts.pids())
    with pytest.raises(ZeroDivisionError):
        with SlurmCluster(hosts, cpus=1) as second:
            job = second.run(["sbatch", "-o", "/dev/null", "--wrap", "sleep 300"])
            assert job.returncode == 0, job.stderr
            daemons = [process.pid for process in second._processes]
            directory = second.directory
            started = wait_until(lambda: [pid for pid in hosts.pids() if _command(pid).startswith("sleep")]
                                 and set(hosts.pids()) - before, timeout=60, what="the job's task")
            assert any(_command(pid).startswith("slurmstepd") for pid in started)
            1 / 0
    alive = [pid for pid in daemons + sorted(started) if _running(pid)]
    assert alive == [], [_command(pid) for pid in alive]
    assert not os.path.exists(directory)
    assert set(hosts.pids()) <= before


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _command(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""
