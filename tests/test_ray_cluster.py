"""Ranks on a Ray cluster (``cluster="ray"``), on a fake multi-node cluster: the run's one ``ray.cluster_utils.Cluster``
(``shared_clusters.fake_ray``: a head and a second node, two CPUs each; the head also offers 2 "slot"s and runs Ray
Client's server), shared with test_ray_client.py and shut down at the run's end.

Each test checks what it promises and that nothing of it is left on the cluster: no rank actor's process, no
placement group (``ray_cluster.leftovers``). Functions run on ranks are defined as a notebook cell defines them
(in ``__main__``), so they travel by value as a notebook's do.
"""
from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from notebook_accel import Session, last_sweep, notebook_launcher, start_launch, sweep
from notebook_accel.errors import LaunchConfigError, LaunchError, LaunchTimeout
from notebook_accel.wire.events import AttemptStarted, OutputLine, RankStarted, ResourceSample
import pdb_dialogue
from ray_cluster import leftovers
from scripts import Recorder, script_env
from waiting import wait_until

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def cluster(fake_ray):
    """The run's one fake Ray cluster (``shared_clusters.fake_ray``), shared with test_ray_client.py."""
    return fake_ray


@pytest.fixture
def ray(cluster):
    """The connected ``ray`` module; after the test, nothing of it may be left on the cluster."""
    yield cluster.ray
    assert leftovers(cluster.ray) == []


# ------------------------------------------------------------------------------ functions run on ranks

def notebook_cell(source: str) -> dict:
    """Run ``source`` as a notebook cell runs (in a namespace named ``__main__``): its functions and classes travel
    to the ranks by value, as a notebook's do (none can import this module), and its classes are the kernel's
    ``__main__``'s, as a notebook's are, so that an exception a rank raises comes back as the very class."""
    namespace = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(source), "/notebook/ray-cell.py", "exec"), namespace)
    main = sys.modules["__main__"]
    for name, value in namespace.items():
        if isinstance(value, type):
            setattr(main, name, value)
    return namespace


CELL = notebook_cell('''
    class Boom(Exception):
        pass


    def stops_at_a_breakpoint():
        import os

        rank = int(os.environ["RANK"])
        if rank == 1:
            breakpoint()
        return rank


    def where_am_i():
        import os

        import ray
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
        return {"env": {name: os.environ[name] for name in names}, "node": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "sum": total.item()}


    def train_with_a_bar_and_metrics(steps):
        import os
        import time

        from notebook_accel import progress, report

        rank = int(os.environ["RANK"])
        for step in progress(range(steps), desc="train"):
            report(step=step, loss=float(rank * 100 + step))
            time.sleep(0.05)
        return rank


    def chatter(lines):
        import os

        rank = os.environ["RANK"]
        for step in range(lines):
            print(f"step {step}: loss 0.5 (rank {rank})")  # near-identical lines: Ray's own log dedup folds these
        return rank


    def fail_in_all_reduce():
        import time

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            time.sleep(1.0)  # rank 0 is in the all-reduce by then, waiting for rank 1
            raise Boom("rank 1 gave up")
        dist.all_reduce(torch.ones(1))
        return "unreachable"


    def die_on_rank_1(stamp):
        import os
        import signal
        import time

        if os.environ["RANK"] == "1":
            print("rank 1 about to die", flush=True)
            with open(stamp, "w") as out:
                out.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)


    def wait_here(ready):
        import os
        import time

        open(f"{ready}.{os.environ['RANK']}", "w").close()
        while True:
            time.sleep(0.05)


    def sum_and_scribble(tensor):
        total = int(tensor.sum())
        tensor.add_(1)  # the rank's own copy: the kernel's tensor stays as it was
        return total


    def survive_a_lost_node():
        import os
        import time

        import ray
        import torch
        import torch.distributed as dist

        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        print(f"attempt {attempt} runs rank {os.environ['RANK']}", flush=True)
        if attempt == 0:
            time.sleep(600)  # until the test removes a node
        dist.init_process_group("gloo")
        total = torch.ones(1)
        dist.all_reduce(total)
        return {"attempt": attempt, "sum": total.item(), "node": ray.get_runtime_context().get_node_id()}


    class Chatty:
        def say(self, text):
            print(text, flush=True)


    def setup():
        global weights
        import torch
        import torch.distributed as dist

        weights = torch.full((2,), float(dist.get_rank() + 1))
        dist.all_reduce(weights)
        return weights.tolist()


    def weights_sum():
        return weights.sum().item()


    def scaled_plus_offset():
        return float(scaled.sum()) + offset


    def total():
        import torch
        import torch.distributed as dist

        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item()


    def sleep_long():
        import time

        for _ in range(6000):  # Python between the sleeps: an interrupt raised in the rank's thread lands there
            time.sleep(0.1)


    def exit_on_rank_1():
        import os

        if os.environ["RANK"] == "1":
            os._exit(3)


    def trial_in_a_group(config):
        import glob
        import os
        import time

        import ray
        import torch.distributed as dist

        dist.init_process_group("gloo")
        started = time.time()
        open(os.path.join(config["folder"], f"started.{config['index']}.{dist.get_rank()}"), "w").close()
        deadline = time.time() + 20   # until a second trial runs too (or 20 s: a sweep one at a time)
        while len(glob.glob(os.path.join(config["folder"], "started.*.0"))) < 2 and time.time() < deadline:
            time.sleep(0.05)
        if config["index"] == 2 and dist.get_rank() == 1:
            raise Boom(f"trial {config['index']} gave up on rank 1")
        dist.barrier()
        group = ray.util.get_current_placement_group()
        dist.destroy_process_group()
        return {"group": group.id.hex(), "bundles": group.bundle_count, "started": started, "ended": time.time()}
''')
globals().update({name: value for name, value in CELL.items() if not name.startswith("__")})


# ---------------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("placement, ranks", [("SPREAD", 2), ("STRICT_SPREAD", 2), ("PACK", 3)])
def test_ranks_are_placed_by_ray_with_torchrun_variables_by_node(ray, cluster, placement, ranks):
    recorder = Recorder()
    job = start_launch(where_am_i, num_processes=ranks, cluster="ray", placement=placement, return_all=True,
                       view=recorder, display="none")
    places = job.wait(600)
    nodes = [place["node"] for place in places]
    assert [place["env"]["RANK"] for place in places] == [str(rank) for rank in range(ranks)]
    assert {place["env"]["WORLD_SIZE"] for place in places} == {str(ranks)}
    assert {place["sum"] for place in places} == {float(sum(range(1, ranks + 1)))}  # one group across the nodes
    # torchrun's variables by node: a node's ranks are consecutive, its local ranks count from 0
    order = list(dict.fromkeys(nodes))
    for place, node in zip(places, nodes):
        local = [other for other in nodes if other == node]
        assert place["env"]["LOCAL_RANK"] == str(nodes[:places.index(place)].count(node))
        assert place["env"]["LOCAL_WORLD_SIZE"] == str(len(local))
        assert place["env"]["GROUP_RANK"] == str(order.index(node))
    assert nodes == sorted(nodes, key=order.index)
    assert {place["env"]["MASTER_ADDR"] for place in places} == {places[0]["ip"]}
    assert len({place["env"]["MASTER_PORT"] for place in places}) == 1
    if placement in ("SPREAD", "STRICT_SPREAD"):
        assert len(set(nodes)) == 2
    else:  # PACK on nodes of 2 CPUs: 2 ranks on one, 1 on the other
        assert sorted(nodes.count(node) for node in set(nodes)) == [1, 2]
    # every rank's row names its node, one name per node
    hosts = {event.rank: event.host for event in recorder.of(RankStarted)}
    assert sorted(hosts) == list(range(ranks))
    assert len(set(hosts.values())) == len(set(nodes))
    assert all(event.reports_resources for event in recorder.of(RankStarted))


def test_every_line_arrives_once_labelled_in_order_and_ray_forwards_none_of_them(ray, capfd):
    recorder = Recorder()
    job = start_launch(chatter, args=(40,), num_processes=2, cluster="ray", placement="STRICT_SPREAD",
                       view=recorder, display="none")
    assert job.wait(600) == "0"
    for rank in (0, 1):
        lines = [event.text for event in recorder.of(OutputLine) if event.rank == rank]
        assert lines == [f"step {step}: loss 0.5 (rank {rank})" for step in range(40)]
    # Ray forwards a plain actor's output to this process (the check below can see forwarded lines) ...
    plain = ray.remote(num_cpus=0)(Chatty).remote()
    ray.get(plain.say.remote("a plain actor's line"))
    wait_until(lambda: "a plain actor's line" in _seen(capfd), timeout=60, what="Ray to forward a plain actor's line")
    ray.kill(plain)
    # ... but not a line of our ranks: their fds 1/2 are ours
    assert "loss 0.5" not in _seen(capfd)


def test_progress_metrics_and_memory_of_ranks_on_the_cluster_reach_the_dashboard(ray):
    from notebook_accel.wire.events import PeakMemoryReport, ProgressUpdate

    recorder = Recorder()
    job = start_launch(train_with_a_bar_and_metrics, args=(6,), num_processes=2, cluster="ray",
                       placement="STRICT_SPREAD", view=recorder, display="none", return_all=True)
    assert job.wait(600) == [0, 1]
    for rank in (0, 1):
        bars = [event for event in recorder.of(ProgressUpdate) if event.rank == rank]
        assert bars and {event.desc for event in bars} == {"train"}, bars
        assert bars[-1].n == 6 and bars[-1].total == 6  # the bar's last state, as the rank's tqdm ended it
        # every report call, each at its step, labelled with the rank that made it
        losses = sorted((row.step, row.value) for row in job.metric_log.rows() if row.rank == rank)
        assert losses == [(step, float(rank * 100 + step)) for step in range(6)], losses
        peaks = [event.peak_rss for event in recorder.of(PeakMemoryReport) if event.rank == rank]
        assert peaks and peaks[-1] > 10 * 2**20, peaks  # the actor process's own high-water mark, > 10 MiB


_captured = []


def _seen(capfd) -> str:
    out, err = capfd.readouterr()
    _captured.append(out + err)
    return "".join(_captured)


def test_a_rank_raising_in_an_all_reduce_is_the_root_cause_with_its_own_type(ray):
    recorder = Recorder()
    started = time.monotonic()
    job = start_launch(fail_in_all_reduce, num_processes=2, cluster="ray", placement="SPREAD", view=recorder,
                       display="none")
    with pytest.raises(Boom, match="rank 1 gave up") as raised:
        job.wait(600)
    assert raised.value.rank == 1
    assert any("rank 1 ran on node" in note for note in raised.value.__notes__)
    assert "[rank 1]" in str(raised.value.__cause__)  # the rank's own traceback
    # rank 0, blocked in the all-reduce its peer left, was stopped, not counted as a failure
    assert job.status == "failed"
    assert time.monotonic() - started < 300


def test_a_rank_that_dies_is_named_with_its_node_within_seconds(ray, tmp_path):
    stamp = tmp_path / "died"
    with pytest.raises(LaunchError) as raised:
        notebook_launcher(die_on_rank_1, args=(str(stamp),), num_processes=2, cluster="ray", placement="SPREAD",
                          display="none")
    noticed = time.time() - float(stamp.read_text())
    message = str(raised.value)
    assert message.startswith("rank 1 on node ") and " died: " in message, message
    assert raised.value.rank == 1
    assert noticed < 30, f"the death was raised {noticed:.1f} s after it"


def test_stop_timeout_and_ctrl_c_end_every_rank_on_the_cluster(ray, tmp_path):
    ready = str(tmp_path / "ready")
    recorder = Recorder()
    started = time.monotonic()
    job = start_launch(wait_here, args=(ready,), num_processes=2, cluster="ray", view=recorder, display="none")
    wait_until(lambda: all(os.path.exists(f"{ready}.{rank}") for rank in (0, 1)), timeout=300, what="the ranks")
    start = time.monotonic() - started   # how long two actors take to start here, now
    # each rank samples its own memory and CPU on its node (the kernel's psutil cannot see it): the rows show them
    wait_until(lambda: {event.rank for event in recorder.of(ResourceSample) if event.rss} == {0, 1}, timeout=120,
               what="a memory sample of each rank")
    stacks = job.dump_stacks()  # through each rank's control thread
    assert sorted(stacks) == [0, 1] and all("in wait_here" in text for text in stacks.values()), stacks
    job.stop()
    with pytest.raises(KeyboardInterrupt):
        job.wait(120)
    assert leftovers(ray) == []

    # a timeout stops them the same way, and says so (after twice the start above and 5 s: the ranks run by then,
    # without waiting out a fixed 20 s where they start in 2 or 3)
    with pytest.raises(LaunchTimeout):
        notebook_launcher(wait_here, args=(str(tmp_path / "timed"),), num_processes=2, cluster="ray",
                          timeout=min(20, round(2 * start + 5)), display="none")
    assert leftovers(ray) == []

    # Jupyter's interrupt is a SIGINT to the kernel: it stops the launch, and the ranks on the cluster with it
    ready = str(tmp_path / "again")
    interrupter = threading.Thread(target=_interrupt_when, args=(ready,), daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(wait_here, args=(ready,), num_processes=2, cluster="ray", display="none")
    interrupter.join()


def _interrupt_when(ready: str) -> None:
    wait_until(lambda: all(os.path.exists(f"{ready}.{rank}") for rank in (0, 1)), timeout=300, what="the ranks")
    os.kill(os.getpid(), signal.SIGINT)


def test_a_breakpoint_in_a_rank_on_the_cluster_with_no_one_to_type_is_skipped_with_a_notice(ray):
    """A launch in a background thread cannot ask anyone (as on local ranks): the breakpoint says so and goes on."""
    recorder = Recorder()
    job = start_launch(CELL["stops_at_a_breakpoint"], num_processes=2, cluster="ray", view=recorder,
                       display="none", return_all=True)
    assert job.wait(300) == [0, 1]
    notices = [event.text for event in recorder.of(OutputLine) if event.stream == "stderr" and event.rank == 1]
    assert any("rank 1's breakpoint at ray-cell.py" in line and "was skipped: the launch runs in a background thread"
               in line for line in notices), notices


PDB_SCRIPT = pdb_dialogue.kernel_script(
    "import os\nimport ray\nray.init(address=os.environ['RAY_ADDRESS'])\n",
    launch='num_processes=2, cluster="ray", placement="STRICT_SPREAD"', session='num_processes=2, cluster="ray"')


def test_pdb_in_a_rank_on_the_cluster_asks_in_the_terminal_for_a_launch_and_a_session(ray, cluster, tmp_path):
    """breakpoint() in a rank on another node: pdb's lines come back labelled, what is typed in the terminal
    reaches the rank through its command thread, and the rank's frame changes (x comes back as 100); a failed
    Session run's ``Session.debug()`` and a launch's ``pdb=True`` post-mortem open in the failing frame."""
    import pexpect

    script = tmp_path / "train.py"
    script.write_text(PDB_SCRIPT)
    child = pexpect.spawn(sys.executable, [str(script)], env=dict(script_env(), RAY_ADDRESS=cluster.cluster.address),
                          cwd=str(tmp_path), encoding="utf-8", timeout=180, dimensions=(40, 200))
    try:
        pdb_dialogue.talk_to_rank_1(child)
    finally:
        child.close(force=True)


CLI_SCRIPT = """
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"{__name__} argv={sys.argv[1:]} rank={dist.get_rank()} group={os.environ['GROUP_RANK']} sum={total.item()}")
    if "--fail" in sys.argv and dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")


if __name__ == "__main__":
    main()
"""


# The command line, with the script's file removed once the launch is planned: every node of the fake cluster shares
# this machine's disk, and this is how a node that never had the file sees it.
CLI_WITHOUT_THE_FILE = """
import os
import sys

import notebook_accel.plan.plan as plan
from notebook_accel.cli import main

planned = plan.plan_launch


def plan_then_remove_the_script(*args, **options):
    made = planned(*args, **options)
    os.remove(sys.argv[-3])
    return made


plan.plan_launch = plan_then_remove_the_script
sys.exit(main(["launch"] + sys.argv[1:]))
"""


def test_the_command_line_launches_a_script_on_the_cluster_whose_nodes_never_saw_its_file(ray, cluster, tmp_path):
    """``notebook-accel launch --cluster ray``: the script's text travels to the ranks (the file is gone by the time
    they start), runs as ``__main__`` with its arguments, and a failing rank's traceback quotes the script's line."""
    script = tmp_path / "train_cli.py"
    options = ["--cluster", "ray", "--num-processes", "2", "--placement", "STRICT_SPREAD", "--resources-per-rank",
               "CPU=1"]
    env = dict(script_env(), RAY_ADDRESS=cluster.cluster.address)
    script.write_text(CLI_SCRIPT)
    done = subprocess.run([sys.executable, "-c", CLI_WITHOUT_THE_FILE, *options, str(script), "--lr", "0.1"],
                          env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not script.exists()
    for rank in (0, 1):
        assert f"[rank {rank}] __main__ argv=['--lr', '0.1'] rank={rank} group={rank} sum=2.0" in done.stdout, \
            done.stdout + done.stderr
    assert leftovers(ray) == []

    script.write_text(CLI_SCRIPT)
    failed = subprocess.run([sys.executable, "-c", CLI_WITHOUT_THE_FILE, *options, str(script), "--fail", "x"],
                            env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "RuntimeError: rank 1 fails on purpose" in failed.stderr, failed.stderr
    assert 'raise RuntimeError("rank 1 fails on purpose")' in failed.stderr, failed.stderr  # its line, from its text

    # a mistyped resource is refused before anything starts, with launch's exit code for bad options
    bad = subprocess.run([sys.executable, "-m", "notebook_accel.cli", "launch", "--cluster", "ray",
                          "--resources-per-rank", "CPU", str(script)], env=env, cwd=str(tmp_path),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "'CPU' is not NAME=AMOUNT" in bad.stderr, bad.stderr


def test_a_kernel_that_called_ray_init_still_launches_local_ranks_safely_and_debugs_them_itself(ray):
    """ray.init() leaves gRPC threads in the kernel (a forked rank may crash) and sets PYTHONBREAKPOINT to Ray's
    debugger: local ranks then start from the fork server, and their breakpoint() is still ours."""
    from notebook_accel.plan.plan import plan_launch

    assert os.environ.get("PYTHONBREAKPOINT", "").startswith("ray.util.rpdb.")  # what Ray did to this process
    assert plan_launch(len, args=((),), num_processes=2).start_method == "forkserver"
    with pytest.raises(LaunchConfigError, match="Ray's threads run in this process"):
        notebook_launcher(len, args=((),), num_processes=2, start_method="fork", display="none")
    recorder = Recorder()
    job = start_launch(CELL["stops_at_a_breakpoint"], num_processes=2, view=recorder, display="none",
                       return_all=True)
    assert job.wait(300) == [0, 1]
    notices = [event.text for event in recorder.of(OutputLine) if event.stream == "stderr" and event.rank == 1]
    assert any("rank 1's breakpoint at ray-cell.py" in line and "was skipped" in line for line in notices), notices


@pytest.mark.parametrize("options, missing", [
    ({"num_processes": 1, "resources_per_rank": {"GPU": 1}}, "no node of the cluster has GPU 1"),
    ({"num_processes": 1, "device": "cuda"}, "no node of the cluster has GPU 1"),
    ({"num_processes": 3, "placement": "STRICT_SPREAD"}, "STRICT_SPREAD needs 3 different nodes"),
    ({"num_processes": 3, "resources_per_rank": {"CPU": 2}, "placement": "STRICT_PACK"}, "STRICT_PACK needs one node"),
    ({"num_processes": 1, "resources_per_rank": {"CPU": 1, "slot": 3}}, "no node of the cluster has slot 3"),
])
def test_resources_the_cluster_cannot_offer_are_refused_within_seconds(ray, options, missing):
    started = time.monotonic()
    with pytest.raises(LaunchConfigError, match=missing):
        notebook_launcher(where_am_i, cluster="ray", display="none", **options)
    assert time.monotonic() - started < 60  # a bound on a hang: Ray alone would wait for ever


def test_the_function_and_a_large_tensor_go_to_the_object_store_once(ray, monkeypatch):
    import torch

    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **options: puts.append(value) or real_put(value, **options))
    tensor = torch.arange(500_000, dtype=torch.int64)  # 4 MB: far above the size that travels inside the pickle
    sums = notebook_launcher(sum_and_scribble, args=(tensor,), num_processes=2, cluster="ray", return_all=True,
                             display="none")
    assert sums == [int(tensor.sum())] * 2
    assert int(tensor[0]) == 0  # the ranks wrote to copies of their own
    (payload,) = puts  # one put for both ranks
    assert len(payload.data) < 64 * 1024  # the pickle holds no tensor bytes...
    assert [blob.raw().nbytes for blob in payload.blobs] == [tensor.numel() * 8]  # ...they travel beside it


def test_a_warm_session_across_two_nodes_keeps_state_and_group_and_recovers(ray):
    with Session(num_processes=2, cluster="ray", placement="STRICT_SPREAD", display="none") as session:
        pids = session.pids
        assert session.run(setup) == [3.0, 3.0]  # the session's own group, across the nodes
        assert session.run(weights_sum, return_all=True) == [6.0, 6.0]
        session.execute("scaled = weights * 10")
        assert [value.tolist() for value in session.pull("scaled")] == [[30.0, 30.0]] * 2
        session.push(offset=5)
        assert session.run(scaled_plus_offset, return_all=True) == [65.0, 65.0]
        assert session.pids == pids  # the same actors all along

        # a rank raising mid-collective: its peer is cut loose, the group replaced, the state kept
        with pytest.raises(Boom) as raised:
            session.run(fail_in_all_reduce)
        assert any("process group was replaced" in note for note in raised.value.__notes__)
        # as a launch's root cause does: the node it ran on (issue 45: a Session's said None)
        assert raised.value.node == session._ranks.node_of(1) and raised.value.node
        assert any(f"rank 1 ran on node {raised.value.node}" in note for note in raised.value.__notes__)
        assert session.run(scaled_plus_offset, return_all=True) == [65.0, 65.0]
        assert session.run(total) == 2.0  # the new group works

        # a timeout interrupts the ranks through their control thread; they stay, and so does their state
        with pytest.raises(LaunchTimeout) as raised:
            session.run(sleep_long, timeout=5)
        assert not any("state lost" in note for note in getattr(raised.value, "__notes__", [])), raised.value.__notes__
        assert session.run(scaled_plus_offset) == 65.0

        # a rank that dies: the ranks are made again, and the error says the state is lost
        with pytest.raises(LaunchError) as raised:
            session.run(exit_on_rank_1)
        assert any("state lost" in note for note in raised.value.__notes__)
        assert session.pids != pids and session.restarts == 1
        assert session.run(total) == 2.0
    assert session.status == "closed"


def test_a_sessions_row_shows_the_memory_of_ranks_on_the_cluster(ray, capsys):
    # Ray ranks sample themselves (the kernel may be elsewhere): each sends its figures as a task ends, the first
    # as it joins the group, so that the row has them from the start and after runs shorter than a sample's second
    with Session(num_processes=2, cluster="ray", display="text") as session:
        ready = capsys.readouterr().out
        assert "rank 0: ?" not in ready and re.search(r"rank 0: \d+(\.\d)? MiB; rank 1: \d+", ready), ready
        before = {rank: sample.time for rank, sample in session._samples.items()}
        time.sleep(1.1)
        assert session.run(lambda: 7) == 7  # a run far shorter than a second: its end brings new figures
        latest = dict(session._samples)
        assert sorted(latest) == [0, 1] and all(latest[rank].rss and latest[rank].time > before[rank]
                                                for rank in latest), (before, latest)


def test_a_node_lost_mid_run_restarts_the_world_on_the_nodes_left(ray, cluster):
    doomed = cluster.add_node(num_cpus=1, resources={"slot": 1})
    doomed_id = doomed.node_id
    recorder = Recorder()
    # One slot on the new node, two on the head: SPREAD puts a rank on each; once the new node is gone, both fit
    # on the head.
    job = start_launch(survive_a_lost_node, num_processes=2, cluster="ray", placement="SPREAD",
                       resources_per_rank={"CPU": 1, "slot": 1}, max_restarts=1, return_all=True, view=recorder,
                       display="none")
    wait_until(lambda: len([line for line in job.outputs[0] + job.outputs[1] if "attempt 0" in line]) == 2,
               timeout=300, what="both ranks of the first attempt")
    hosts = [event.host for event in recorder.of(RankStarted)]
    if not any(doomed_id[:6] in host for host in hosts):  # SPREAD put no rank there: nothing to lose
        job.stop()
        pytest.fail(f"SPREAD placed no rank on the new node {doomed_id[:6]}: {hosts}")
    cluster.remove_node(doomed)
    results = job.wait(600)
    assert [result["attempt"] for result in results] == [1, 1]
    assert {result["sum"] for result in results} == {2.0}
    assert doomed_id not in {result["node"] for result in results}
    (restart,) = [event for event in recorder.of(AttemptStarted) if event.attempt == 1]
    assert "was lost" in restart.previous_errors[0], restart.previous_errors


CONTRACT = ["test_result_of_rank0_and_of_every_rank_on_request",
            "test_root_cause_is_the_rank_that_raised_and_its_peers_are_stopped", "test_stop_requested_stops_every_rank",
            "test_timeout_stops_every_rank", "test_output_is_labelled_by_rank_and_progress_reported"]


def test_a_sweep_runs_max_concurrent_trials_at_once_each_in_its_own_placement_group(ray, tmp_path):
    """Two trials of 2 ranks at once (the cluster holds four such: only max_concurrent keeps it at two), each its
    own placement group of 2 bundles; results in config order, the failing trial's own exception in its place."""
    configs = [{"index": index, "folder": str(tmp_path)} for index in range(4)]
    results = sweep(trial_in_a_group, configs, num_processes=2, cluster="ray", resources_per_rank={"CPU": 0.5},
                    max_concurrent=2, errors="return", display="none")
    assert isinstance(results[2], Boom) and "trial 2 gave up on rank 1" in str(results[2])
    ran = [results[index] for index in (0, 1, 3)]
    assert [trial.state for trial in last_sweep().trials] == ["finished", "finished", "failed", "finished"]
    assert len({result["group"] for result in ran}) == 3 and {result["bundles"] for result in ran} == {2}
    spans = [(result["started"], result["ended"]) for result in ran]
    at_once = max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)
    assert at_once == 2, spans   # two at once: the first two waited for each other (20 s alone would fail this)
    assert len(list(tmp_path.glob("started.*.0"))) == 4


def test_a_failing_trial_of_a_sweep_on_ray_is_raised_as_itself_after_the_others_ended(ray, tmp_path):
    configs = [{"index": index, "folder": str(tmp_path)} for index in (1, 2)]
    with pytest.raises(Boom, match="trial 2 gave up on rank 1") as raised:
        sweep(trial_in_a_group, configs, num_processes=2, cluster="ray", resources_per_rank={"CPU": 0.5},
              max_concurrent=2, display="none")
    notes = " ".join(raised.value.__notes__)
    assert "raised in rank 1 of 2" in notes and "sweep trial 1" in notes and "1 of 2 sweep trials failed" in notes
    assert "in trial_in_a_group" in str(raised.value.__cause__)   # the rank's own traceback
    assert last_sweep().trials[0].result["bundles"] == 2


@pytest.mark.parametrize("check", CONTRACT)
def test_the_backend_contract_holds_for_ray_actors(ray, check):
    """tests/test_backend_contract.py's checks, on the table's "ray" line: run from here, where pytest's process
    is a Ray driver already (that file's fork cases would be refused after it became one)."""
    import cloudpickle

    import test_backend_contract as contract

    assert set(CONTRACT) == {name for name in dir(contract) if name.startswith("test_")
                             and "case" in inspect.signature(getattr(contract, name)).parameters}
    cloudpickle.register_pickle_by_value(contract)  # the actors cannot import a test module: its functions by value
    try:
        getattr(contract, check)("ray")
    finally:
        cloudpickle.unregister_pickle_by_value(contract)
