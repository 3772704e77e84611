"""Multi-node launches and restarts: two real node processes on localhost (``GLOO_SOCKET_IFNAME=lo``), each
calling ``notebook_launcher(num_nodes=2, ...)`` as a notebook per node would, with torch elastic's static
and c10d rendezvous, real gloo ranks and real signals."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from scripts import script_env
from waiting import wait_until

NODE = """
import json, os, sys, time
from notebook_accel import notebook_launcher

WORLD_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                   "ROLE_WORLD_SIZE")

def train(fail_rank, fail_attempts, sleep, ready_dir):
    if fail_rank == "environment only":  # what the rank was given, before any collective could refuse it
        return {name: os.environ[name] for name in WORLD_VARIABLES}
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)   # across both nodes: the fresh store of this attempt must work
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"rank {dist.get_rank()} attempt {attempt} sum {total.item():g}", flush=True)
    if ready_dir:  # the test waits for every rank to get here (past init_process_group) before acting
        open(os.path.join(ready_dir, f"rank-{dist.get_rank()}-attempt-{attempt}"), "w").close()
    if dist.get_rank() == fail_rank and attempt < fail_attempts:
        raise ValueError(f"bad batch on rank {fail_rank} in attempt {attempt}")
    time.sleep(sleep)
    dist.barrier()
    names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS")
    return {name: os.environ[name] for name in names}

options = json.loads(sys.argv[1])
job = options.pop("job")
try:
    call = dict(args=(job["fail_rank"], job["fail_attempts"], job["sleep"], job["ready_dir"]), num_processes=2,
                display="text", return_all=True, **options)
    if job.get("stop_when_ready"):  # the panel's Stop button: a background launch, stopped from this thread
        from notebook_accel.launcher import start_launch
        launch = start_launch(train, **call)
        deadline = time.monotonic() + 120
        while len(os.listdir(job["ready_dir"])) < 4 and time.monotonic() < deadline:  # every rank in train()
            time.sleep(0.1)
        launch.stop()
        value = launch.wait(120)
    else:
        for _ in range(job.get("launches", 1)):  # the same cell run again: same endpoint, same rdzv_id
            value = notebook_launcher(train, **call)
    print("OUTCOME " + json.dumps({"result": value}), flush=True)
except BaseException as error:
    print("OUTCOME " + json.dumps({"error": type(error).__name__, "message": (str(error).splitlines() or [""])[0],
                                   "rank": getattr(error, "rank", None), "host": getattr(error, "host", None),
                                   "notes": getattr(error, "__notes__", [])}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def node_env():
    env = script_env()
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def start_node(node_rank, backend: str, port: int, *, fail_rank=-1, fail_attempts=0, sleep=0.0,
               num_nodes=2, ready_dir=None, stop_when_ready=False, launches=1, **options) -> subprocess.Popen:
    """``ready_dir``: each rank creates ``rank-R-attempt-A`` there once past init_process_group;
    ``stop_when_ready``: the node stops its launch (as the panel's Stop button would) once 4 such files exist."""
    config = dict(num_nodes=num_nodes, node_rank=node_rank, rdzv_backend=backend,
                  rdzv_endpoint=f"127.0.0.1:{port}", rdzv_conf={"join_timeout": 60},
                  job=dict(fail_rank=fail_rank, fail_attempts=fail_attempts, sleep=sleep, ready_dir=ready_dir,
                           stop_when_ready=stop_when_ready, launches=launches))
    config.update(options)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(NODE), json.dumps(config)], env=node_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def run_two_nodes(backend: str, **job):
    port = free_port()
    nodes = [start_node(rank, backend, port, **job) for rank in (0, 1)]
    return [finish(node) for node in nodes]


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_nodes_run_four_ranks_with_global_ranks(backend):
    (first, out0), (second, out1) = run_two_nodes(backend)
    assert "result" in first and "result" in second, (first, second)
    seen = [(int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["GROUP_RANK"]), env["WORLD_SIZE"],
             env["LOCAL_WORLD_SIZE"]) for env in first["result"] + second["result"]]
    assert seen == [(0, 0, 0, "4", "2"), (1, 1, 0, "4", "2"), (2, 0, 1, "4", "2"), (3, 1, 1, "4", "2")]
    for rank, out in ((0, out0), (1, out0), (2, out1), (3, out1)):  # labelled by global rank on its node
        assert f"[rank {rank}] rank {rank} attempt 0 sum 6" in out
    assert "node rank 0 of 2 · finished" in out0 and "node rank 1 of 2 · finished" in out1


def test_every_rank_of_both_nodes_is_given_its_global_rank_local_rank_and_node():
    # Read before init_process_group: an off-by-one RANK on node 1 was caught only because gloo refused a rank
    # of 4 in a world of 4 (an off-by-one the other way would collide with a rank of node 0 instead).
    (first, _), (second, _) = run_two_nodes("static", fail_rank="environment only")
    assert "result" in first and "result" in second, (first, second)
    seen = [{name: int(value) for name, value in env.items()} for env in first["result"] + second["result"]]
    expected = [dict(RANK=rank, LOCAL_RANK=rank % 2, GROUP_RANK=rank // 2, ROLE_RANK=rank, WORLD_SIZE=4,
                     LOCAL_WORLD_SIZE=2, ROLE_WORLD_SIZE=4) for rank in range(4)]
    assert seen == expected


@pytest.mark.skipif(shutil.which("etcd") is None or importlib.util.find_spec("etcd") is None,
                    reason="needs an etcd server binary and python-etcd (torch's etcd rendezvous): none here")
def test_two_nodes_meet_through_an_etcd_rendezvous(tmp_path):
    # Where etcd is: README "static, c10d, etcd and plugin backends all work", and node_rank orders the nodes.
    port, peer_port = free_port(), free_port()
    server = subprocess.Popen(["etcd", "--data-dir", str(tmp_path / "etcd"), "--enable-v2",
                               "--listen-client-urls", f"http://127.0.0.1:{port}",
                               "--advertise-client-urls", f"http://127.0.0.1:{port}",
                               "--listen-peer-urls", f"http://127.0.0.1:{peer_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: listening(port), 60, "etcd to listen")
        nodes = [start_node(rank, "etcd", port) for rank in (1, 0)]  # node 1 arrives first
        outcomes = [finish(node) for node in nodes]
    finally:
        server.terminate()
        server.wait(30)
    (second, _), (first, out0) = outcomes
    assert [env["RANK"] for env in first["result"]] == ["0", "1"], out0
    assert [env["RANK"] for env in second["result"]] == ["2", "3"]
    assert "[rank 3] rank 3 attempt 0 sum 6" in outcomes[0][1]


def test_c10d_orders_the_nodes_by_their_node_rank_not_by_arrival():
    # torch's c10d rendezvous numbers nodes by arrival (on one host: by pid): node_rank=1 starts first here.
    port = free_port()
    second = start_node(1, "c10d", port)
    first = start_node(0, "c10d", port)
    (outcome0, out0), (outcome1, out1) = finish(first), finish(second)
    assert [env["RANK"] for env in outcome0["result"]] == ["0", "1"], out0
    assert [env["RANK"] for env in outcome1["result"]] == ["2", "3"], out1
    assert {env["GROUP_RANK"] for env in outcome1["result"]} == {"1"}
    assert "node rank 1 of 2 · finished" in out1


def test_c10d_without_node_rank_numbers_the_nodes_by_arrival_and_refuses_half_given_or_repeated_ones():
    port = free_port()
    nodes = [start_node(None, "c10d", port) for _ in range(2)]
    ranks = sorted(env["RANK"] for node in nodes for env in finish(node)[0]["result"])
    assert ranks == ["0", "1", "2", "3"]
    for given in ((None, 1), (1, 1)):
        port = free_port()
        started = [start_node(rank, "c10d", port) for rank in given]
        outcomes = [finish(node)[0] for node in started]
        assert all(outcome.get("error") == "LaunchError" for outcome in outcomes), outcomes
        expected = "was given on 1 of the 2 nodes" if None in given else "node_rank=1 was given on 2 nodes"
        assert all(expected in outcome["message"] for outcome in outcomes), outcomes


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_the_same_launch_runs_again_on_the_same_endpoint(backend):
    # The first launch's stores must be gone (c10d: its rendezvous closed, its listener freed) before the
    # second joins; with c10d either node may host the store.
    (first, out0), (second, out1) = run_two_nodes(backend, launches=3)
    assert [env["RANK"] for env in first["result"] + second["result"]] == ["0", "1", "2", "3"], (out0, out1)
    assert out0.count("node rank 0 of 2 · finished") == 3 and out1.count("node rank 1 of 2 · finished") == 3


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_failure_on_node_1_is_the_root_cause_on_both_nodes(backend):
    (first, out0), (second, out1) = run_two_nodes(backend, fail_rank=3, fail_attempts=1, sleep=20)
    for outcome in (first, second):
        assert outcome["error"] == "ValueError", outcome
        assert outcome["message"] == "bad batch on rank 3 in attempt 0"
        assert outcome["rank"] == 3 and outcome["host"] == socket.gethostname()
        assert any("rank 3 ran on node 1" in note for note in outcome["notes"])
    assert "[rank 3] failed (root cause)" in out1
    assert "error: ValueError: bad batch on rank 3" in out0  # node 0's dashboard names the remote root cause


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_restart_runs_the_whole_world_again_on_a_fresh_store(backend):
    # Rank 3 fails in attempt 0 only. With torch's cached rendezvous store, attempt 1's gloo would connect
    # to attempt 0's addresses ("Connection refused"); a fresh store per attempt makes it succeed.
    (first, out0), (second, out1) = run_two_nodes(backend, fail_rank=3, fail_attempts=1, max_restarts=1)
    assert "result" in first and "result" in second, (first, second, out0, out1)
    counts = {env["TORCHELASTIC_RESTART_COUNT"] for env in first["result"] + second["result"]}
    assert counts == {"1"}
    assert [env["RANK"] for env in first["result"] + second["result"]] == ["0", "1", "2", "3"]
    for out in (out0, out1):
        assert "attempt 2/2 · finished" in out
        assert "attempt 1: rank 3 on node 1" in out  # the earlier attempt's root cause stays visible


def test_restarts_stop_when_they_run_out_and_the_error_lists_every_attempt():
    (first, _), (second, _) = run_two_nodes("static", fail_rank=1, fail_attempts=5, max_restarts=1)
    for outcome in (first, second):
        assert outcome["error"] == "ValueError" and outcome["message"] == "bad batch on rank 1 in attempt 1"
        assert any("attempt 1 failed first: rank 1 on node 0" in note for note in outcome["notes"])


def test_a_node_that_never_joins_gives_a_clear_error():
    port = free_port()
    lonely = start_node(0, "static", port, rdzv_conf={"join_timeout": 3})
    outcome, _ = finish(lonely)
    assert outcome["error"] == "LaunchError"
    assert "the 2 nodes did not all join the 'static' rendezvous" in outcome["message"]
    assert "within 3 s" in outcome["message"]


def all_four_ranks_ready(ready_dir, nodes):
    """Wait until every rank is past init_process_group (sleeping in train()); fail early if a node ended."""
    try:
        wait_until(lambda: len(os.listdir(ready_dir)) >= 4 or any(node.poll() is not None for node in nodes),
                   timeout=120, what="all four ranks to reach train()")
        assert all(node.poll() is None for node in nodes), "a node ended before all four ranks ran"
    except AssertionError as failure:
        for node in nodes:
            node.kill()  # its ranks die with it (PR_SET_PDEATHSIG)
        raise AssertionError(f"{failure}: {[node.communicate() for node in nodes]}") from None


def test_ctrl_c_on_one_node_stops_both(tmp_path):
    port = free_port()
    nodes = [start_node(rank, "c10d", port, sleep=120, ready_dir=str(tmp_path)) for rank in (0, 1)]
    started = time.monotonic()
    all_four_ranks_ready(str(tmp_path), nodes)
    nodes[0].send_signal(signal.SIGINT)
    (first, _), (second, _) = finish(nodes[0]), finish(nodes[1])
    assert first["error"] == "KeyboardInterrupt"
    assert second["error"] == "KeyboardInterrupt" and "stopped on node 0" in second["message"]
    assert time.monotonic() - started < 100  # not the ranks' 120 s sleep


def test_stop_on_one_node_stops_both_and_is_never_restarted(tmp_path):
    port = free_port()
    nodes = [start_node(0, "static", port, sleep=120, max_restarts=2, ready_dir=str(tmp_path)),
             start_node(1, "static", port, sleep=120, max_restarts=2, ready_dir=str(tmp_path), stop_when_ready=True)]
    started = time.monotonic()
    (first, out0), (second, out1) = finish(nodes[0]), finish(nodes[1])
    assert first["error"] == "KeyboardInterrupt" and "stopped on node 1" in first["message"], first
    assert second["error"] == "KeyboardInterrupt", second
    assert "attempt 1/3 · stopped" in out0 and "attempt 2/3" not in out0
    assert time.monotonic() - started < 100


def test_restarts_on_one_node_need_no_rendezvous():
    code = """
        import os
        from notebook_accel import notebook_launcher
        def job():
            import torch.distributed as dist
            dist.init_process_group("gloo")
            dist.barrier()
            if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and dist.get_rank() == 1:
                raise RuntimeError("first attempt fails")
            return os.environ["TORCHELASTIC_RESTART_COUNT"]
        print("RESULT", notebook_launcher(job, num_processes=2, max_restarts=2, display="none", return_all=True))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=node_env(), capture_output=True,
                          text=True, timeout=180)
    assert "RESULT ['1', '1']" in done.stdout, done.stdout + done.stderr


def test_no_restart_when_the_function_cannot_be_loaded_in_the_rank(tmp_path):
    # The argument unpickles only by raising (as a class missing in the rank would): the rank says so in its
    # failure event, and restarting could only fail the same way, so max_restarts=2 runs one attempt.
    code = f"""
        from notebook_accel import notebook_launcher

        def fail_loading(path):
            import os
            with open(path, "a") as log:  # which attempt tried to load it
                log.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + "\\n")
            raise ImportError("no module named 'only_in_the_kernel'")

        class OnlyInTheKernel:
            def __reduce__(self):
                return fail_loading, ({str(tmp_path / 'loads.log')!r},)

        try:
            notebook_launcher(lambda data: 1, args=(OnlyInTheKernel(),), num_processes=2, max_restarts=2,
                              start_method="spawn", display="none")
        except ImportError as error:
            print("RAISED", error)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=node_env(), capture_output=True,
                          text=True, timeout=180)
    assert "RAISED no module named 'only_in_the_kernel'" in done.stdout, done.stdout + done.stderr
    # one attempt (the second rank may be stopped before it even got to loading)
    assert set((tmp_path / "loads.log").read_text().splitlines()) == {"0"}


def test_the_cli_runs_a_script_over_two_nodes_with_accelerates_flags(tmp_path):
    script = tmp_path / "job.py"
    # Rank 3 exits only once every rank has said hello (a file each, both nodes being on this machine): a failure
    # stops its peers, so under load rank 0 was stopped before its hello and the test failed on a right launch.
    script.write_text(textwrap.dedent("""
        import os, sys, time
        rank = os.environ["RANK"]
        print(f"hello from {rank} of {os.environ['WORLD_SIZE']}", flush=True)
        open(os.path.join(os.environ["HELLO_DIR"], rank), "w").close()
        deadline = time.monotonic() + 120
        while rank == "3" and len(os.listdir(os.environ["HELLO_DIR"])) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        if rank == "3":
            sys.exit(7)
    """))
    port = free_port()
    env = node_env()
    env["HF_HOME"] = str(tmp_path / "hf")
    env["HELLO_DIR"] = str(tmp_path / "hello")
    os.mkdir(env["HELLO_DIR"])
    nodes = [subprocess.Popen([sys.executable, "-m", "notebook_accel.cli", "launch", "--num_processes", "4",
                               "--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip",
                               "127.0.0.1", "--main_process_port", str(port), str(script)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=180) for node in nodes]
    assert [node.returncode for node in nodes] == [7, 7], outputs
    assert "[rank 0] hello from 0 of 4" in outputs[0][0] and "[rank 3] hello from 3 of 4" in outputs[1][0], outputs


def test_a_node_whose_launcher_dies_is_named_and_not_waited_for(tmp_path):
    port = free_port()
    nodes = [start_node(rank, "static", port, sleep=120, rdzv_conf={"join_timeout": 60, "node_timeout": 5},
                        ready_dir=str(tmp_path))
             for rank in (0, 1)]
    all_four_ranks_ready(str(tmp_path), nodes)
    nodes[1].kill()  # node 1's kernel dies; its ranks die with it (PR_SET_PDEATHSIG)
    nodes[1].communicate()
    started = time.monotonic()
    outcome, out = finish(nodes[0])
    assert outcome["error"] == "LaunchError", outcome
    assert "node 1 stopped responding" in outcome["message"]
    assert time.monotonic() - started < 60  # not the ranks' 120 s sleep


def test_the_timeout_counts_over_the_whole_world():
    port = free_port()
    nodes = [start_node(rank, "static", port, sleep=120, timeout=8) for rank in (0, 1)]
    outcomes = [finish(node)[0] for node in nodes]
    for outcome in outcomes:
        assert outcome["error"] == "LaunchTimeout", outcome
        assert "ran past timeout=8 s" in outcome["message"]


@pytest.mark.parametrize("options, message", [
    (dict(num_nodes=2), "num_nodes > 1 needs rdzv_endpoint='host:port'"),
    (dict(num_nodes=2, node_rank=2, rdzv_endpoint="127.0.0.1:1"), "node_rank must be None or an int in 0..1"),
    (dict(num_nodes=2, rdzv_backend="zookeeper", rdzv_endpoint="h:1"), "'zookeeper' is not a registered torch"),
    (dict(num_nodes=2, rdzv_endpoint="h"), "must be 'host:port'"),
    (dict(max_restarts=-1), "max_restarts must be an int >= 0"),
    (dict(num_nodes=2, rdzv_endpoint="h:1", rdzv_conf={"join_timeout": "soon"}), "rdzv_conf['join_timeout']"),
])
def test_bad_node_options_are_refused_before_anything_starts(options, message):
    from notebook_accel.errors import LaunchConfigError
    from notebook_accel.plan.plan import plan_launch

    with pytest.raises(LaunchConfigError) as caught:
        plan_launch(print, num_processes=1, device="cpu", **options)
    assert message in str(caught.value)
