"""Promises of docs/several-machines.md that no other test exercised (issue 17 §3, items 4, 5):
two real node processes on localhost (``GLOO_SOCKET_IFNAME=lo``), each calling ``notebook_launcher(num_nodes=2,
...)`` as a notebook per node would, with real gloo ranks.

* "Each node's cell returns its lowest rank's value (rank 0's on node 0)" (the default, ``return_all=False``).
* The raised root cause carries ``exc.node`` (and ``exc.rank``, ``exc.host``) on every node.
* ``rdzv_conf["local_addr"]`` is the address the other nodes reach this node at.
* Ranks get ``TORCHELASTIC_RUN_ID`` (the ``rdzv_id``; torchrun's default ``"none"``).
* Restarts: never after a timeout, counted over all attempts, nor after a function that fails to unpickle.

(tests/test_nodes.py covers the rest: global ranks, restarts, Ctrl-C/Stop, lost nodes, the world timeout.)
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from scripts import run_script, script_env

pytestmark = pytest.mark.timeout(300)

NODE = """
import json, os, sys, time
from notebook_accel import notebook_launcher

def train(job):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)  # all four ranks of both nodes met through this attempt's store
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if job.get("log"):  # every rank's lifetime in each attempt, in seconds since it got here
        started = time.monotonic()
        path = os.path.join(job["log"], f"attempt{attempt}-rank{rank}")
        deadline = started + job.get("live", 0)
        while time.monotonic() < deadline:
            with open(path + ".new", "w") as log:  # replaced whole: a rank killed mid-write leaves its last figure
                log.write(f"{time.monotonic() - started:.2f}")
            os.replace(path + ".new", path)
            if attempt == 0 and rank == job.get("fail_rank") and time.monotonic() - started > job["fail_after"]:
                raise ValueError("attempt 0 fails late")
            time.sleep(0.2)
    if rank == job.get("fail_rank"):
        if job.get("how") == "exit":
            os._exit(3)
        raise ValueError(f"bad batch on rank {rank}")
    return {"RANK": os.environ["RANK"], "TORCHELASTIC_RUN_ID": os.environ["TORCHELASTIC_RUN_ID"],
            "MASTER_ADDR": os.environ["MASTER_ADDR"]}

options = json.loads(sys.argv[1])
job = options.pop("job")
try:
    value = notebook_launcher(train, args=(job,), num_processes=2, display="text", **options)
    print("OUTCOME " + json.dumps({"result": value}), flush=True)
except BaseException as error:
    print("OUTCOME " + json.dumps({"error": type(error).__name__, "message": (str(error).splitlines() or [""])[0],
                                   "rank": getattr(error, "rank", None), "node": getattr(error, "node", "unset"),
                                   "host": getattr(error, "host", None), "exitcode": getattr(error, "exitcode", None),
                                   "notes": getattr(error, "__notes__", [])}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_env():
    env = script_env()
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def run_two_nodes(backend="static", job=None, rdzv_conf=None, **options):
    """Start both nodes with the same options; their outcomes and outputs, node 0's first."""
    port = free_port()
    nodes = []
    for node_rank in (0, 1):
        config = dict(num_nodes=2, node_rank=node_rank, rdzv_backend=backend, rdzv_endpoint=f"127.0.0.1:{port}",
                      rdzv_conf={"join_timeout": 60, **(rdzv_conf or {})}, job=job or {}, **options)
        nodes.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(NODE), json.dumps(config)],
                                      env=node_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [finish(node) for node in nodes]


def finish(process: subprocess.Popen, timeout: float = 180):
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"node did not finish:\n{out}\n{err}")
    lines = [line for line in out.splitlines() if line.startswith("OUTCOME ")]
    assert lines, f"no outcome (exit {process.returncode}):\n{out}\n{err}"
    return json.loads(lines[-1][len("OUTCOME "):]), out


# ---------------------------------------------------------------------------------------- item 5: what comes back

def test_each_node_returns_its_lowest_ranks_value_and_ranks_get_the_run_id():
    (first, out0), (second, out1) = run_two_nodes(rdzv_id="job-17")
    assert first.get("result", {}).get("RANK") == "0", (first, out0)   # rank 0's value on node 0
    assert second.get("result", {}).get("RANK") == "2", (second, out1)  # node 1's lowest rank: 2
    assert first["result"]["TORCHELASTIC_RUN_ID"] == second["result"]["TORCHELASTIC_RUN_ID"] == "job-17"


def test_the_run_id_is_torchruns_none_by_default():
    (first, out0), (second, _) = run_two_nodes(return_all=True)
    assert [value["TORCHELASTIC_RUN_ID"] for value in first["result"] + second["result"]] == ["none"] * 4, out0


@pytest.mark.parametrize("how, error", [("raise", "ValueError"), ("exit", "LaunchError")])
def test_every_node_raises_the_root_cause_with_its_node_rank_and_host(how, error):
    # Rank 2 runs on node 1: node 0 must say node 1 too (not its own node, nor unset).
    (first, out0), (second, out1) = run_two_nodes(job={"fail_rank": 2, "how": how})
    for outcome in (first, second):
        assert outcome.get("error") == error, (outcome, out0, out1)
        assert outcome["rank"] == 2 and outcome["node"] == 1 and outcome["host"] == socket.gethostname(), outcome
    if how == "exit":
        assert first["exitcode"] == second["exitcode"] == 3


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_local_addr_is_where_the_other_nodes_reach_this_node(backend):
    # The node the rendezvous makes first hosts each attempt's store for every rank (MASTER_ADDR). Without
    # local_addr its address is the endpoint's host (static) or its hostname's (c10d); 127.0.0.2 (loopback
    # too, so reachable here) is told apart from both.
    (first, out0), (second, out1) = run_two_nodes(backend=backend, return_all=True,
                                                  rdzv_conf={"local_addr": "127.0.0.2"})
    assert "result" in first and "result" in second, (first, second, out0, out1)
    assert {value["MASTER_ADDR"] for value in first["result"] + second["result"]} == {"127.0.0.2"}


# --------------------------------------------------------------------------------------- item 4: no restart when ...

def test_no_restart_after_a_timeout_and_the_timeout_counts_over_every_attempt(tmp_path):
    # Attempt 0 fails after 8 s (restarted: max_restarts=2); attempt 1 would run 120 s. With timeout=14 over
    # the whole launch, attempt 1 gets what is left (about 6 s minus the restart), then the timeout ends the
    # launch without a third attempt. A timeout counted per attempt would let attempt 1 run 14 s.
    (first, out0), (second, out1) = run_two_nodes(
        job={"log": str(tmp_path), "live": 120, "fail_rank": 1, "fail_after": 8}, timeout=14, max_restarts=2)
    for outcome in (first, second):
        assert outcome.get("error") == "LaunchTimeout", (outcome, out0, out1)
    lived = {path.name: float(path.read_text() or 0) for path in tmp_path.iterdir() if path.suffix != ".new"}
    assert sorted(lived) == [f"attempt{a}-rank{r}" for a in (0, 1) for r in range(4)], lived  # no attempt 2
    assert min(lived[f"attempt0-rank{r}"] for r in range(4)) > 6, lived  # attempt 0 used up 8 s of the 14
    assert max(lived[f"attempt1-rank{r}"] for r in range(4)) < 11, lived  # not a fresh 14 s
    assert "attempt 3/3" not in out0 + out1


def test_no_restart_when_the_function_itself_fails_to_unpickle_in_the_ranks(tmp_path):
    # The function (a closure) carries an object that unpickles only by raising, as a class missing in the
    # ranks would: every rank fails loading it, and max_restarts=2 must not run it twice more.
    code = f"""
        import json, sys
        from notebook_accel import notebook_launcher

        def fail_loading(path):
            import os
            with open(path, "a") as log:  # which attempt tried to load it
                log.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + "\\n")
            raise ImportError("no module named 'only_in_the_kernel'")

        class OnlyInTheKernel:
            def __reduce__(self):
                return fail_loading, ({str(tmp_path / 'loads.log')!r},)

        def make_train():
            data = OnlyInTheKernel()
            return lambda: data is not None

        try:
            notebook_launcher(make_train(), num_processes=2, max_restarts=2, start_method="spawn",
                              display="text")
        except ImportError as error:
            print("RAISED", error)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=node_env(), capture_output=True,
                          text=True, timeout=180)
    assert "RAISED no module named 'only_in_the_kernel'" in done.stdout, done.stdout + done.stderr
    assert set((tmp_path / "loads.log").read_text().splitlines()) == {"0"}
    assert "attempt 2/3" not in done.stdout


def test_a_function_that_cannot_be_pickled_is_refused_once_before_anything_starts():
    # Refused in the kernel (a lock cannot be pickled for spawn ranks) even with restarts left: no rank runs.
    done = run_script("""
        import threading
        from notebook_accel import notebook_launcher
        lock = threading.Lock()
        try:
            notebook_launcher(lambda: lock.locked(), num_processes=2, max_restarts=2, start_method="spawn",
                              display="text")
        except Exception as error:
            print("RAISED", type(error).__name__, str(error).splitlines()[0])
    """, timeout=120)
    assert "RAISED" in done.stdout, done.stdout + done.stderr
    assert "LaunchConfigError" in done.stdout and "cannot be pickled: global 'lock'" in done.stdout, done.stdout
    assert "[rank" not in done.stdout and "attempt" not in done.stdout, done.stdout
