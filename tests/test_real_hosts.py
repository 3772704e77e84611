"""Ranks on real hosts: network namespaces with distinct addresses on a bridge (``real_hosts``), whose host name
resolves to loopback in each, as on many real machines. Fake clusters (``ray.cluster_utils``) put every node and the
driver on one address and cannot see what breaks here: a rank offering its peers ``127.0.0.1`` (gloo's
``connectFullMesh failed ... remote=[127.0.0.1]`` without ``GLOO_SOCKET_IFNAME``), a ``MASTER_ADDR`` from the wrong
node, a c10d rendezvous store no node hosts.

- Ray: one ``ray start --block`` per host (the head on host 0), shared by the module. The notebook is a script on
  the head host, or outside the hosts through Ray Client (``ray://``, the bridge's own address).
- A detached launch across the hosts outlives its kernel (SIGKILLed); a new kernel attaches, gets every line and
  the result.
- torch elastic: one node's launch per host (``num_nodes=2``), with a c10d and with a static rendezvous.

The hosts are the run's (``shared_clusters.real_hosts_pair``, the Slurm tests' too); the Ray nodes end with the
module (``RealHosts.stop`` fails if one outlives it); each script checks
that its launches left no placement group on the cluster. Needs root (skipped otherwise).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

import real_hosts
from real_hosts import RealHosts, unavailable
from scripts import PACKAGE_ROOT, script_env

FAST_IMPORTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_fast_imports")
RAY_PORT = 6379
CLIENT_PORT = 10001

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]


def ray_env(temp: str) -> dict:
    """A Ray node's (or driver's) environment: Ray's session files and auth token under a temp dir of its own."""
    env = script_env()
    env.update(RAY_TMPDIR=temp, HOME=temp, RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join([FAST_IMPORTS, PACKAGE_ROOT, env.get("PYTHONPATH", "")]))
    return env


RAY = os.path.join(os.path.dirname(sys.executable), "ray")


@pytest.fixture(scope="module")
def ray_hosts(real_hosts_pair):
    """The run's two hosts (``shared_clusters.real_hosts_pair``), each a Ray node (``ray start --block``) for the
    module: the head at host 0 with Ray Client's server. Stopped at the module's end, every Ray process with them (the
    Slurm tests use the same hosts next)."""
    temp = tempfile.mkdtemp(prefix="na-rh-", dir="/tmp")   # short: Ray's Unix socket paths are limited
    hosts = real_hosts_pair
    before, nodes = hosts.pids(), []
    try:
        head = hosts.address(0)
        common = ["--num-cpus=2", "--disable-usage-stats", "--block"]
        for host, args in ((0, ["--head", f"--port={RAY_PORT}", f"--ray-client-server-port={CLIENT_PORT}",
                                "--include-dashboard=false"]),
                           (1, [f"--address={head}:{RAY_PORT}"])):
            node_temp = os.path.join(temp, f"h{host}")
            os.makedirs(node_temp)
            with open(os.path.join(node_temp, "ray-start.log"), "w") as log:  # shown when the node does not join
                nodes.append(hosts.start(host, [RAY, "start", f"--node-ip-address={hosts.address(host)}", *args,
                                                *common], env=ray_env(node_temp), keep=True, stdout=log,
                                         stderr=subprocess.STDOUT))
            if host == 0:  # the second node joins a head that is up (else: "No node info found for head node")
                wait_for_line(os.path.join(node_temp, "ray-start.log"), "Ray runtime started", 180)
        yield hosts, temp
    finally:
        try:
            # `ray start --block` outlives a SIGTERM by more than 10 s (it was SIGKILLed after the whole grace, each
            # node in turn: 24 s per run), and nothing here is about how a Ray node stops: 2 s, then SIGKILL
            hosts.stop(nodes, since=before, grace=2.0)
        finally:
            shutil.rmtree(temp, ignore_errors=True)


def wait_for_line(path: str, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with open(path, errors="replace") as log:
            written = log.read()
        if text in written:
            return
        assert time.monotonic() < deadline, f"no {text!r} in {path} after {timeout:g} s:\n{written[-3000:]}"
        time.sleep(0.5)


# The notebook: a launch across the two hosts, then ("full") a failure and a warm session. argv: the Ray address,
# "full" or "launch".
RAY_NOTEBOOK = """
import os
import sys
import time

import ray
from notebook_accel import Session, notebook_launcher

ray.init(sys.argv[1])
FULL = sys.argv[2] == "full"
deadline = time.monotonic() + 180
while sum(node["Alive"] for node in ray.nodes()) < 2:   # the second host's node joins
    assert time.monotonic() < deadline, ray.nodes()
    time.sleep(0.5)


class Boom(Exception):
    pass


def where():
    import ray
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    for step in range(2):
        print(f"step {step} of rank {os.environ['RANK']}")
    return {"rank": os.environ["RANK"], "group_rank": os.environ["GROUP_RANK"], "node": ray.util.get_node_ip_address(),
            "master": os.environ["MASTER_ADDR"], "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "total": total.item()}


def fail_on_rank_1():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    if os.environ["RANK"] == "1":
        raise Boom("rank 1 gave up")
    dist.barrier()


def setup():
    global weights
    import torch
    import torch.distributed as dist

    dist.barrier()   # the session's group spans both hosts
    weights = torch.full((2,), float(os.environ["RANK"]) + 1)
    return weights.tolist()


for row in notebook_launcher(where, num_processes=2, cluster="ray", placement="STRICT_SPREAD", display="text",
                             timeout=240, return_all=True):
    print("WHERE", row["rank"], row["group_rank"], row["node"], row["master"], row["ifname"], row["total"], flush=True)
if FULL:  # a failure's root cause, and a warm session across the hosts
    try:
        notebook_launcher(fail_on_rank_1, num_processes=2, cluster="ray", placement="STRICT_SPREAD", display="none",
                          timeout=240)
    except Boom as error:
        print("RAISED", type(error).__name__, error, "|", " ".join(getattr(error, "__notes__", [])), flush=True)
    with Session(num_processes=2, cluster="ray", placement="STRICT_SPREAD", display="none") as session:
        print("WARM", session.run(setup, return_all=True), flush=True)
        session.push(offset=5)
        session.execute("shifted = weights + offset")
        print("PULLED", [value.tolist() for value in session.pull("shifted")], flush=True)
from ray.util.placement_group import placement_group_table
print("GROUPS LEFT", [key for key, table in placement_group_table().items() if table["state"] != "REMOVED"], flush=True)
"""


def check_notebook(done: subprocess.CompletedProcess, hosts: RealHosts, full: bool) -> None:
    shown = f"exit {done.returncode}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}"
    assert "connectFullMesh" not in shown, shown   # gloo offered a loopback address across hosts
    assert done.returncode == 0, shown
    where = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("WHERE ")]
    addresses = {hosts.address(0), hosts.address(1)}
    assert len(where) == 2, shown
    (rank0, group0, node0, master0, ifname0, total0), (rank1, group1, node1, master1, ifname1, total1) = where
    # placement across hosts; RANK/GROUP_RANK by node; MASTER_ADDR the address of rank 0's host on every rank
    assert {node0, node1} == addresses and (rank0, group0, rank1, group1) == ("0", "0", "1", "1"), shown
    assert master0 == master1 == node0, shown
    # each rank's gloo interface is its own host's (the interface names are the hosts' own)
    assert (ifname0, ifname1) == (hosts.interfaces[hosts.addresses.index(node0)],
                                  hosts.interfaces[hosts.addresses.index(node1)]), shown
    assert float(total0) == float(total1) == 3.0, shown     # the all-reduce crossed the hosts
    for rank in (0, 1):  # every line once, labelled by its rank
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"[rank {rank}] step ")]
        assert lines == [f"[rank {rank}] step {step} of rank {rank}" for step in range(2)], shown
    # the rank's start-up info says which interface and address it offers its peers
    assert f"via {ifname0} {node0}" in done.stdout and f"via {ifname1} {node1}" in done.stdout, shown
    if full:
        assert "RAISED Boom rank 1 gave up" in done.stdout and "ran on node" in done.stdout, shown   # the root cause
        assert "WARM [[1.0, 1.0], [2.0, 2.0]]" in done.stdout, shown
        assert "PULLED [[6.0, 6.0], [7.0, 7.0]]" in done.stdout, shown
    assert "GROUPS LEFT []" in done.stdout, shown


def test_a_notebook_on_the_head_host_launches_across_hosts(ray_hosts):
    hosts, temp = ray_hosts
    done = hosts.run(0, [sys.executable, "-c", textwrap.dedent(RAY_NOTEBOOK), f"{hosts.address(0)}:{RAY_PORT}",
                      "full"],
                     env=ray_env(os.path.join(temp, "h0")), timeout=540)
    check_notebook(done, hosts, full=True)


def test_a_notebook_outside_the_hosts_launches_through_ray_client(ray_hosts):
    hosts, temp = ray_hosts
    address = f"ray://{hosts.address(0)}:{CLIENT_PORT}"
    client_temp = os.path.join(temp, "client")
    os.makedirs(client_temp, exist_ok=True)
    for _ in range(3):  # Ray's client server sometimes fails to start a client's server (see test_ray_client.py)
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(RAY_NOTEBOOK), address, "launch"],
                              env=ray_env(client_temp),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=540)
        # ... or its proxy failed while starting it (psutil read a zombie's command line: "Initialization failure
        # from server"). Nothing of ours ran yet: a client would retry, and so does the test.
        if not (done.returncode and not done.stdout and ("Starting Ray client server failed" in done.stderr
                                                          or "Initialization failure from server" in done.stderr)):
            break
    check_notebook(done, hosts, full=False)


# A detached launch across the hosts (tests/test_ray_detached.py's ``work``: lines and metrics, waiting halfway for a
# file): the kernel that starts it is SIGKILLed while the ranks wait; a new kernel attaches and gets the rest.
DETACHED_START = """
import sys
import time

import ray

ray.init(sys.argv[1])
deadline = time.monotonic() + 180
while sum(node["Alive"] for node in ray.nodes()) < 2:
    assert time.monotonic() < deadline, ray.nodes()
    time.sleep(0.5)
WORK
from notebook_accel import start_launch

job = start_launch(work, args=(sys.argv[2], sys.argv[3]), num_processes=2, cluster="ray", placement="STRICT_SPREAD",
                   detach=True)
print("JOB", job.id, flush=True)
time.sleep(600)   # idle until culled (SIGKILLed by the test)
"""

DETACHED_ATTACH = """
import sys

import ray

ray.init(sys.argv[1])
import notebook_accel

print("RESULT", notebook_accel.attach(sys.argv[2], display="text"), flush=True)
notebook_accel.DetachedJob(sys.argv[2]).forget()
print("FORGOTTEN", [row["id"] for row in notebook_accel.detached_jobs(sys.argv[3]).to_dict("records")], flush=True)
"""


def test_a_detached_launch_across_hosts_outlives_its_kernel_and_a_new_kernel_attaches(ray_hosts, tmp_path):
    from test_ray_detached import WORK

    hosts, temp = ray_hosts
    env, address = ray_env(os.path.join(temp, "h0")), f"{hosts.address(0)}:{RAY_PORT}"
    ready, go = str(tmp_path / "ready"), tmp_path / "go"
    kernel = hosts.start(0, [sys.executable, "-c", textwrap.dedent(DETACHED_START).replace("WORK", WORK), address,
                             ready, str(go)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = kernel.stdout.readline()
        assert line.startswith("JOB "), line + kernel.stderr.read(3000)
        job_id = line.split()[1]
        deadline = time.monotonic() + 240
        while not all(os.path.exists(f"{ready}.{rank}") for rank in (0, 1)):
            assert time.monotonic() < deadline and kernel.poll() is None, "the ranks did not reach halfway"
            time.sleep(0.1)
    finally:
        kernel.kill()  # SIGKILL: no atexit, no cleanup, as a culled kernel
        kernel.communicate(timeout=60)
    go.touch()  # the ranks go on with no kernel
    done = hosts.run(0, [sys.executable, "-c", textwrap.dedent(DETACHED_ATTACH), address, job_id, str(tmp_path)],
                     env=env, timeout=300)
    shown = f"exit {done.returncode}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}"
    assert done.returncode == 0, shown
    assert "RESULT {'rank': 0, 'steps': 6}" in done.stdout, shown
    for rank in (0, 1):  # every line of every rank, before and after the kernel died, once and in order
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"[rank {rank}] rank {rank} step ")]
        assert lines == [f"[rank {rank}] rank {rank} step {step} {'before' if step < 3 else 'after'}"
                         for step in range(6)], shown
    (forgotten,) = [line for line in done.stdout.splitlines() if line.startswith("FORGOTTEN ")]
    assert job_id not in forgotten, shown


# ----------------------------------------------------------------------------------- torch elastic: a node per host

NODE = """
import os
import sys

from notebook_accel import notebook_launcher

backend, endpoint, node_rank = sys.argv[1], sys.argv[2], int(sys.argv[3])


def where():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {os.environ['RANK']} of group {os.environ['GROUP_RANK']}")
    return [os.environ["RANK"], os.environ["MASTER_ADDR"], os.environ.get("GLOO_SOCKET_IFNAME"), total.item()]


result = notebook_launcher(where, num_processes=1, num_nodes=2, node_rank=node_rank, rdzv_backend=backend,
                           rdzv_endpoint=endpoint, rdzv_conf={"join_timeout": 90}, display="text", timeout=150)
print("RESULT", *result, flush=True)
"""


@pytest.fixture
def node_hosts(real_hosts_pair):
    """The run's two hosts (``shared_clusters.real_hosts_pair``); each node's launch ends within its test."""
    return real_hosts_pair


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_one_node_per_host_meets_and_all_reduces_across_hosts(node_hosts, backend):
    """c10d: the host whose interface has the endpoint's address hosts the rendezvous store (torch would ask the
    host name, 127.0.0.1 here: no node hosts it, both wait out their tries); then gloo across the hosts."""
    hosts = node_hosts
    endpoint = f"{hosts.address(0)}:29400"
    nodes = [hosts.start(node, [sys.executable, "-c", textwrap.dedent(NODE), backend, endpoint, str(node)],
                         env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outputs = []
    for process in nodes:
        try:
            out, err = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            out, err = process.communicate()
        outputs.append((process.returncode, out, err))
    shown = "\n".join(f"--- node {node}: exit {code}\n{out[-4000:]}\n{err[-4000:]}"
                      for node, (code, out, err) in enumerate(outputs))
    assert "connectFullMesh" not in shown, shown
    assert all(code == 0 for code, _, _ in outputs), shown
    for node, (_, out, _) in enumerate(outputs):
        result = [line.split()[1:] for line in out.splitlines() if line.startswith("RESULT ")]
        # MASTER_ADDR is node 0's host; each node's ranks use its own host's interface; the all-reduce crossed
        assert result == [[str(node), hosts.address(0), hosts.interfaces[node], "3.0"]], shown
        assert f"[rank {node}] rank {node} of group {node}" in out, shown
        assert f"via {hosts.interfaces[node]} {hosts.address(node)}" in out, shown


# ----------------------------------------------------------------------------------- the harness itself

ESCAPES = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid)
"""


def test_the_hosts_end_every_process_of_theirs_and_leave_no_namespace_or_link():
    """A daemon that left its process group (and its parent) still runs in its host's namespace: ``close`` finds it
    there (``ip netns pids``) and ends it, then nothing of the hosts is left."""
    hosts = RealHosts(2)
    try:
        pid = int(hosts.run(1, [sys.executable, "-c", textwrap.dedent(ESCAPES)], env=script_env()).stdout)
        assert pid in hosts.pids()
    finally:
        hosts.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert not any(name in namespaces for name in hosts.namespaces), namespaces
    assert hosts.bridge not in links and not any(f"nav{hosts.bridge[3:]}-" in line for line in links.splitlines()), links


# A run killed before its hosts' ``close`` (a SIGKILLed pytest, a session's end): it made hosts on slice argv[1] and
# died with them in place. Network namespaces and links outlive their maker; the slice's lock (an abstract socket) does
# not. Prints the bridge and the namespace it left.
LEAVES_HOSTS = """
import os, sys
sys.path.insert(0, {tests!r})
import real_hosts
index = int(sys.argv[1])
real_hosts._take_slice = lambda: (index, None)   # the slice the test holds, as the dead run held it
hosts = real_hosts.RealHosts(1)
print(hosts.bridge, hosts.namespaces[0], flush=True)
os._exit(0)
"""


def _names(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_hosts_on_a_slice_a_killed_run_left_behind_reach_this_machine(monkeypatch):
    """CI once ran on a machine where a killed run had left slice 15's namespaces and bridge: the new run took the
    free lock of slice 15, its bridge got the same address beside the dead one, the kernel routed the /28 to the dead
    bridge, and no slurmd reached its controller (every Slurm test errored). A slice is cleared when it is taken."""
    index, lock = real_hosts._take_slice()
    try:
        tests = os.path.dirname(os.path.abspath(__file__))
        left = subprocess.run([sys.executable, "-c", LEAVES_HOSTS.format(tests=tests), str(index)],
                              capture_output=True, text=True, timeout=60)
        assert left.returncode == 0, left.stderr
        bridge, namespace = left.stdout.split()
        assert namespace in _names("netns", "list") and bridge in _names("-o", "link", "show")
        assert real_hosts._prepare_slice(index)
    except BaseException:
        lock.close()
        raise
    monkeypatch.setattr(real_hosts, "_take_slice", lambda: (index, lock))
    with RealHosts(1) as hosts:
        listener = socket.create_server((hosts.outside_address, 0))
        with listener:
            port = listener.getsockname()[1]
            reach = hosts.run(0, [sys.executable, "-c", f"import socket; socket.create_connection("
                                                        f"({hosts.outside_address!r}, {port}), timeout=5).close()"],
                              timeout=60)
        assert reach.returncode == 0, f"host 0 did not reach {hosts.outside_address}:{port}: {reach.stderr}"
    assert namespace not in _names("netns", "list") and bridge not in _names("-o", "link", "show")
    assert not os.path.exists(f"/etc/netns/{namespace}")


def test_a_slice_whose_addresses_something_else_holds_is_passed_over():
    """An address of the slice on an interface that is not the harness's (someone's own setup): the slice is not
    used, and nothing of theirs is touched."""
    index, lock = real_hosts._take_slice()
    other = f"naother{os.getpid() % 100000}"
    try:
        subprocess.run(["ip", "link", "add", other, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{real_hosts.SUBNET}.{index * real_hosts.SLICE + 5}/32", "dev", other],
                       check=True)
        assert not real_hosts._prepare_slice(index)
        assert other in _names("-o", "link", "show")
        subprocess.run(["ip", "link", "del", other], check=True)
        assert real_hosts._prepare_slice(index)   # their bridge was all that held it
    finally:
        subprocess.run(["ip", "link", "del", other], capture_output=True)
        lock.close()
