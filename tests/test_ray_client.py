"""``cluster="ray"`` from a kernel that reaches the cluster only through Ray Client (``ray.init("ray://HEAD:10001")``),
as a notebook outside a KubeRay or lab cluster's network does.

The fake two-node cluster (the run's one, shared with test_ray_cluster.py: ``shared_clusters.fake_ray``) has its
head run Ray's client server; the kernel is a script in a fresh process (a Ray Client
driver cannot share a process with the cluster's own driver connection), which launches, fails, times out and keeps a
warm session through ``ray://``. Ray Client refuses some of Ray's options (``.options(concurrency_group=...)`` on an
actor method was one: every launch failed before it began), and every event of the dashboard crosses its proxy. The
test process, connected to the cluster directly, checks that nothing was left on it.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from ray_cluster import leftovers
from scripts import script_env

pytestmark = pytest.mark.timeout(400)

SCRIPT = """
import os
import sys

import ray
from notebook_accel import LaunchTimeout, Session, notebook_launcher

ray.init(sys.argv[1])  # ray://127.0.0.1:PORT
assert ray.util.client.ray.is_connected(), "not a Ray Client connection"


class Boom(Exception):
    pass


def train(offset):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    for step in range(3):
        print(f"step {step} of rank {os.environ['RANK']} in group {os.environ['GROUP_RANK']}")
    return total.item() + offset


def fail_on_rank_1():
    if os.environ["RANK"] == "1":
        raise Boom("rank 1 gave up")
    return "fine"


def sleep_long():
    import time

    for _ in range(6000):
        time.sleep(0.1)


def setup():
    global weights
    import torch

    weights = torch.full((2,), float(os.environ["RANK"]) + 1)
    return weights.tolist()


print("RESULT", notebook_launcher(train, args=(10,), num_processes=2, cluster="ray", placement="STRICT_SPREAD",
                                  display="text", return_all=True), flush=True)
try:
    notebook_launcher(fail_on_rank_1, num_processes=2, cluster="ray", display="none")
except Boom as error:
    print("RAISED", type(error).__name__, error, "|", " ".join(getattr(error, "__notes__", [])), flush=True)
try:
    notebook_launcher(sleep_long, num_processes=2, cluster="ray", display="none", timeout=3)
except LaunchTimeout as error:
    print("TIMED OUT", flush=True)
with Session(num_processes=2, cluster="ray", placement="STRICT_SPREAD", display="none") as session:
    print("WARM", session.run(setup, return_all=True), flush=True)
    session.push(offset=5)
    session.execute("shifted = weights + offset")
    print("PULLED", [value.tolist() for value in session.pull("shifted")], flush=True)
"""


def client_server_logs(cluster) -> str:
    """The tails of Ray's client server logs (the proxy's and each client's own server's), for a failure's message."""
    tails = []
    for path in sorted(glob.glob(os.path.join(cluster.temp, "**", "logs", "ray_client_server*"), recursive=True)):
        if "session_latest" not in path:
            with open(path, errors="replace") as log:
                tails.append(f"--- {os.path.basename(path)}\n{log.read()[-3000:]}")
    return "\n".join(tails)


@pytest.fixture
def client_cluster(fake_ray):
    """The run's one fake Ray cluster (``shared_clusters.fake_ray``, shared with test_ray_cluster.py) and its head's
    Ray Client address."""
    return fake_ray, fake_ray.client_address


# What ray.init("ray://...") says when the proxy's server process for this client died at its start (Ray's crash)
RAY_SERVER_DIED = ("Starting Ray client server failed", "in start_specific_server")


def test_a_kernel_on_ray_client_launches_fails_times_out_and_keeps_a_session_leaving_nothing(client_cluster):
    cluster, address = client_cluster
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), address], env=script_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        # Ray's client proxy starts a server process for each client; here about 1 start in 15 died at once (its
        # log: "SpecificServer startup failed"; the process's exit code, with that log line patched to show it,
        # was -11, SIGSEGV; compare ray-project/ray#48267), which the script's first line, ray.init, reports as
        # this error. Nothing of ours ran yet: a client would retry, and so does the test. The same crash, a moment
        # sooner, is the proxy's own psutil failing on the dead server ("ZombieProcess" from start_specific_server):
        # seen once in a full run.
        if not (done.returncode and not done.stdout and any(said in done.stderr for said in RAY_SERVER_DIED)):
            break
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown + client_server_logs(cluster)
    assert "RESULT [13.0, 13.0]" in done.stdout, shown
    for rank in (0, 1):  # every line once, labelled, each rank on its own node (STRICT_SPREAD)
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"[rank {rank}] step ")]
        assert lines == [f"[rank {rank}] step {step} of rank {rank} in group {rank}" for step in range(3)], shown
    assert "RAISED Boom rank 1 gave up" in done.stdout and "ran on node" in done.stdout, shown
    assert "TIMED OUT" in done.stdout, shown
    assert "WARM [[1.0, 1.0], [2.0, 2.0]]" in done.stdout, shown
    assert "PULLED [[6.0, 6.0], [7.0, 7.0]]" in done.stdout, shown
    assert leftovers(cluster.ray) == []
