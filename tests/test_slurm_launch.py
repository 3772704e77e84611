"""``cluster="slurm"`` on a real Slurm cluster (``slurm_cluster``: slurmctld here as the login node, a slurmd per
network namespace, each node its own address): a launch's ranks are a job step of the kernel's allocation.

The "kernel" is a script run under ``salloc -N2`` from the login node, as a batchspawner notebook runs inside its job:
it launches three times (a run, a failure, a timeout) and reports what it saw, with the allocation's steps after each
(``squeue -s``). One allocation for the three keeps the module short on a loaded machine.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from typing import Dict

import pytest

import slurm_cluster
import test_backend_contract
from scripts import script_env
from waiting import wait_until

pytestmark = [pytest.mark.skipif(slurm_cluster.unavailable() is not None, reason=slurm_cluster.unavailable() or ""),
              pytest.mark.timeout(600)]   # the first test runs the kernel script: three launches, on 2 loaded cores

LINES = 30

KERNEL = textwrap.dedent('''
    import json, os, subprocess, threading, time
    from notebook_accel import notebook_launcher
    from notebook_accel.errors import LaunchTimeout

    report = {"job": os.environ["SLURM_JOB_ID"]}

    def give_up(why):   # a break that would hang the script: say it, leave no job of ours, end at once
        report["broken"] = why
        print("REPORT " + json.dumps(report), flush=True)
        os._exit(0)

    def no_new_job():   # inside an allocation a launch is a step of it: a job of its own would pend for ever
        while True:
            listed = subprocess.run(["squeue", "-h", "-o", "%%i %%j"], capture_output=True, text=True).stdout
            new = [line for line in listed.splitlines() if line.split()[0] != report["job"]]
            if new:
                subprocess.run(["scancel"] + [line.split()[0] for line in new])
                give_up(f"a launch inside allocation {report['job']} asked Slurm for a new job: {new}")
            time.sleep(0.5)

    def bounded(what, seconds):   # a launch that does not return in time: named, not a 600 s pytest timeout
        timer = threading.Timer(seconds, give_up, (f"{what} had not returned after {seconds} s",))
        timer.daemon = True
        timer.start()
        return timer

    def scancelled():   # the steps the launches scancelled so far (the test's recording scancel, first on PATH)
        path = os.environ["SCANCEL_CALLS"]
        return open(path).read().split() if os.path.exists(path) else []

    threading.Thread(target=no_new_job, daemon=True).start()

    def steps():
        listed = subprocess.run(["squeue", "-h", "-s", "-j", os.environ["SLURM_JOB_ID"], "-o", "%%i"],
                                capture_output=True, text=True).stdout.split()
        return [step for step in listed if not step.endswith((".extern", ".interactive", ".batch"))]

    def train(lines):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        for number in range(lines):
            print(f"line {number} of rank {dist.get_rank()}")
        names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GLOO_SOCKET_IFNAME", "SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_STEP_ID")
        place = {name: os.environ.get(name) for name in names}
        place["sum"] = total.item()
        dist.destroy_process_group()
        return place

    def fail():
        if os.environ["RANK"] == "1":
            raise ValueError("rank one's own error")
        time.sleep(120)

    def hang():
        import re
        print("hanging", flush=True)
        if os.environ["RANK"] == "1":   # stuck in C code that holds the GIL: no message reaches this task any more
            re.match(r"(a+)+$", "a" * 64 + "b")
        time.sleep(600)

    bound = bounded("the first launch (a run of 4 ranks)", 300)
    began = time.monotonic()
    report["ranks"] = notebook_launcher(train, (%(lines)d,), num_processes=4, num_nodes=2, cluster="slurm",
                                        display="text", return_all=True)
    bound.cancel()
    quick = time.monotonic() - began   # a step of 4 ranks started, made a gloo group, printed and ended
    report["steps_after_run"] = steps()
    bound = bounded("the failing launch (rank 1 raised, rank 0 sleeps)", 180)
    try:
        notebook_launcher(fail, num_processes=2, num_nodes=2, cluster="slurm", display="text")
    except Exception as error:
        report["failure"] = {"type": type(error).__name__, "message": str(error), "node": getattr(error, "node", None),
                             "notes": getattr(error, "__notes__", [])}
    bound.cancel()
    report["steps_after_failure"] = steps()
    before = scancelled()
    limit = min(20, round(quick + 5))   # the hang needs only a step's start of 2 ranks: less than the run above
    bound = bounded(f"the launch timed out at {limit} s (rank 1 stuck holding the GIL: only a cancel of its step "
                    f"ends it)", limit + 120)
    try:   # a step starts in 1 to 3 s here (the test checks both ranks were hanging when it ended)
        notebook_launcher(hang, num_processes=2, num_nodes=2, cluster="slurm", display="text", timeout=limit)
    except LaunchTimeout as error:
        report["timeout"] = str(error)
    bound.cancel()
    report["scancelled_at_timeout"] = scancelled()[len(before):]
    report["steps_after_timeout"] = steps()
    print("REPORT " + json.dumps(report), flush=True)
''') % {"lines": LINES}


@pytest.fixture(scope="module")
def cluster(slurm):
    """The run's one Slurm cluster (``shared_clusters.slurm``)."""
    return slurm


@pytest.fixture(scope="module")
def inside(cluster, tmp_path_factory):
    """The kernel script's run inside a two-node allocation: its report, its output (stdout, then stderr), and the
    queue after."""
    folder = tmp_path_factory.mktemp("slurm")
    script = folder / "kernel.py"
    script.write_text(KERNEL)
    env = dict(script_env(), SLURM_CONF=cluster.conf, **recording_scancel(folder))
    done = cluster.run(["salloc", "-N2", "-n4", sys.executable, str(script)], env=env, timeout=600)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{cluster.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert "broken" not in report, f"{report['broken']}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return report, done.stdout + done.stderr, cluster.wait_no_jobs()


def recording_scancel(folder) -> Dict[str, str]:
    """The variables of a kernel whose ``scancel`` (first on its ``PATH``) appends each call's last argument (the
    job or step cancelled) to the file ``SCANCEL_CALLS`` names, then runs Slurm's."""
    calls = folder / "scancel.calls"
    tool = folder / "bin" / "scancel"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\nfor last in "$@"; do :; done\necho "$last" >> {calls}\n'
                    f'exec {shutil.which("scancel")} "$@"\n')
    tool.chmod(0o755)
    return {"PATH": f"{tool.parent}{os.pathsep}{os.environ['PATH']}", "SCANCEL_CALLS": str(calls)}


def test_ranks_are_a_step_of_the_kernels_allocation_placed_by_slurm(cluster, inside):
    report, _, _ = inside
    ranks = report["ranks"]
    nodes = cluster.nodes
    assert [(rank["RANK"], rank["LOCAL_RANK"], rank["GROUP_RANK"], rank["SLURMD_NODENAME"]) for rank in ranks] == [
        ("0", "0", "0", nodes[0]), ("1", "1", "0", nodes[0]), ("2", "0", "1", nodes[1]), ("3", "1", "1", nodes[1])]
    assert {rank["WORLD_SIZE"] for rank in ranks} == {"4"} and {rank["LOCAL_WORLD_SIZE"] for rank in ranks} == {"2"}
    # No new job: every rank is in the kernel's allocation, all in one step of it.
    assert {rank["SLURM_JOB_ID"] for rank in ranks} == {report["job"]}
    assert len({rank["SLURM_STEP_ID"] for rank in ranks}) == 1


def test_ranks_meet_at_rank_0s_node_over_its_interface_and_reduce_across_nodes(cluster, inside):
    ranks = inside[0]["ranks"]
    hosts = cluster.hosts
    assert {rank["MASTER_ADDR"] for rank in ranks} == {hosts.address(0)}   # rank 0's node, not the login node
    assert len({rank["MASTER_PORT"] for rank in ranks}) == 1
    assert [rank["GLOO_SOCKET_IFNAME"] for rank in ranks] == [hosts.interfaces[0], hosts.interfaces[0],
                                                               hosts.interfaces[1], hosts.interfaces[1]]
    assert {rank["sum"] for rank in ranks} == {10.0}


def test_every_line_of_every_rank_comes_back_once_in_order_labelled(inside):
    output = inside[1]
    for rank in range(4):
        lines = [line for line in output.splitlines() if line.startswith(f"[rank {rank}] line ")]
        assert lines == [f"[rank {rank}] line {number} of rank {rank}" for number in range(LINES)]
    # issue 46: torch's c10d said "[c10d] The hostname of the client socket cannot be retrieved. err=-3" in every
    # launch: its reverse lookup of a peer's address asked a DNS server the test hosts cannot reach (real_hosts.py)
    assert "hostname of the client socket cannot be retrieved" not in output, output


def test_the_root_cause_is_the_failing_ranks_own_exception_with_its_node(cluster, inside):
    failure = inside[0]["failure"]
    assert failure["type"] == "ValueError"
    assert "rank one's own error" in failure["message"]
    assert failure["node"] == cluster.nodes[1]
    assert any(cluster.nodes[1] in note for note in failure["notes"])


def test_a_timeout_cancels_the_step_and_nothing_is_left_in_the_queue(inside):
    """Even with a rank that cannot be interrupted (in C code holding the GIL): ``scancel`` of the step."""
    report, output, left = inside
    assert "timeout" in report
    # The timeout ended ranks that were running: rank 0 said so. Rank 1's own "hanging" is lost: a task's output is
    # read by a thread of its process, which cannot run while rank 1 holds the GIL (docs/troubleshooting.md).
    assert "[rank 0] hanging" in output, \
        f"the ranks never reached the hang: {[line for line in output.splitlines() if 'hang' in line]}"
    assert report["steps_after_run"] == [] and report["steps_after_failure"] == []
    # issue 44: without its scancel the step still ended, by srun's SIGTERM, 5 to 12 s later: no step was left
    assert any(step.startswith(report["job"] + ".") for step in report["scancelled_at_timeout"]), \
        f"the timed-out launch's step was not scancelled (scancel calls: {report['scancelled_at_timeout']})"
    assert report["steps_after_timeout"] == []
    assert left == []


# ------------------------------------------------------------------------------------- outside an allocation

OUTSIDE = textwrap.dedent('''
    import json, os
    from notebook_accel import notebook_launcher

    def where():
        return {name: os.environ.get(name) for name in ("RANK", "SLURMD_NODENAME", "SLURM_JOB_ID")}

    ranks = notebook_launcher(where, num_processes=2, num_nodes=2, cluster="slurm", display="text", return_all=True,
                              slurm={"partition": "debug", "time": "00:05:00"})
    print("REPORT " + json.dumps(ranks), flush=True)
''')


def test_outside_an_allocation_the_launch_asks_for_one_says_it_pends_and_gives_it_back(cluster, tmp_path):
    """A job holding every CPU makes the launch's allocation pend ("Resources") until it ends (here: cancelled once
    the launch said it pends, not a fixed sleep); the ranks then run in a job of their own, which is gone from the
    queue when the launch returns."""
    script = tmp_path / "outside.py"
    script.write_text(OUTSIDE)
    blocker = cluster.run(["sbatch", "--parsable", "-N2", "-n4", "-o", "/dev/null", "--wrap", "sleep 300"])
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.strip()
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    out, err, process = tmp_path / "stdout", tmp_path / "stderr", None
    try:
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen([sys.executable, str(script)], env=env, stdout=stdout, stderr=stderr)
        wait_until(lambda: "pending in the queue (Resources)" in err.read_text() or process.poll() is not None,
                   timeout=120, what="the launch to say it pends")
        cluster.run(["scancel", blocker_id])   # the nodes are free: the launch's job starts
        process.wait(300)
    finally:
        cluster.run(["scancel", blocker_id])
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
    done = subprocess.CompletedProcess(process.args, process.returncode, out.read_text(), err.read_text())
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    ranks = json.loads(reports[0][len("REPORT "):])
    assert [rank["SLURMD_NODENAME"] for rank in ranks] == cluster.nodes
    assert len({rank["SLURM_JOB_ID"] for rank in ranks}) == 1 and ranks[0]["SLURM_JOB_ID"] != blocker_id
    assert "pending in the queue (Resources); interrupting the kernel (Ctrl-C) ends the wait, as do Stop and the " \
           "timeout" in done.stderr, done.stderr   # a Session's words and stream (test_slurm_session.py), and more
    assert "s in the queue" in done.stderr.split("pending in the queue (Resources)", 1)[1]
    assert cluster.wait_no_jobs(timeout=15) == []


PENDING = textwrap.dedent('''
    from notebook_accel import notebook_launcher
    from notebook_accel.errors import LaunchTimeout

    try:
        notebook_launcher(print, num_processes=2, num_nodes=2, cluster="slurm", display="none", timeout=8,
                          slurm={"partition": "debug", "time": "00:05:00"})
    except LaunchTimeout as error:
        print("TIMEOUT " + " ".join(str(error).split()), flush=True)
''')


def test_a_timeout_while_the_job_pends_says_it_never_left_the_queue_and_why(cluster, tmp_path):
    """Issue 46: a launch that timed out while its job still pended ended "ranks still running: none"."""
    blocker = cluster.run(["sbatch", "--parsable", "-N2", "-n4", "-o", "/dev/null", "--wrap", "sleep 300"])
    assert blocker.returncode == 0, blocker.stderr
    try:
        script = tmp_path / "pending.py"
        script.write_text(PENDING)
        done = cluster.run([sys.executable, str(script)], env=dict(script_env(), SLURM_CONF=cluster.conf),
                           timeout=300)
        said = [line for line in done.stdout.splitlines() if line.startswith("TIMEOUT ")]
        assert said, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "before any rank started" in said[0] and "never left the queue (Resources)" in said[0], said[0]
        assert "ranks still running" not in said[0], said[0]
    finally:
        cluster.run(["scancel", blocker.stdout.strip()])
    assert cluster.wait_no_jobs(timeout=30) == []


@pytest.mark.parametrize("request_, num_nodes, refusal", [
    ({"partition": "nope"}, 2, "no partition 'nope' on this Slurm cluster (it has debug)"),
    ({"time": "01:00:00"}, 2, "above partition 'debug''s time limit (00:30:00)"),
    ({}, 3, "num_nodes=3 is more than the 2 node(s) of partition 'debug'"),
    ({"nodes": 2}, 2, "is set by the launch itself"),
])
def test_what_slurm_could_never_grant_is_refused_before_anything_waits(cluster, monkeypatch, request_, num_nodes,
                                                                       refusal):
    from notebook_accel import notebook_launcher
    from notebook_accel.errors import LaunchConfigError

    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LaunchConfigError) as refused:
        notebook_launcher(print, num_processes=num_nodes, num_nodes=num_nodes, cluster="slurm", display="none",
                          slurm=request_)
    assert refusal in str(refused.value)
    assert cluster.jobs() == []


def test_without_slurm_the_error_names_what_is_missing(monkeypatch, tmp_path):
    from notebook_accel import notebook_launcher
    from notebook_accel.errors import LaunchConfigError

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LaunchConfigError) as refused:
        notebook_launcher(print, num_processes=2, num_nodes=2, cluster="slurm", display="none")
    assert "srun" in str(refused.value) and "salloc" in str(refused.value) and "not on this machine's PATH" in \
        str(refused.value)


def test_notebook_accel_launch_runs_a_script_as_a_step_of_the_job(cluster, tmp_path):
    """``notebook-accel launch --cluster slurm`` inside ``salloc``: the script on every rank, over both nodes."""
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('on', os.environ['SLURMD_NODENAME'], 'rank', os.environ['RANK'])\n")
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    done = cluster.run(["salloc", "-N2", sys.executable, "-m", "notebook_accel.cli", "launch", "--cluster", "slurm",
                        "--num-processes", "2", "--num-nodes", "2", str(script)], env=env, timeout=300)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"[rank 0] on {cluster.nodes[0]} rank 0" in done.stdout
    assert f"[rank 1] on {cluster.nodes[1]} rank 1" in done.stdout
    assert cluster.wait_no_jobs() == []


HOLDING = textwrap.dedent('''
    import time
    from notebook_accel import notebook_launcher

    def hold():
        print("ranks up", flush=True)
        time.sleep(600)

    notebook_launcher(hold, num_processes=2, num_nodes=2, cluster="slurm", display="text", slurm={"time": "00:05:00"})
''')


def test_a_killed_kernel_leaves_no_job_no_step_and_no_rank(cluster, tmp_path):
    """SIGKILL of the kernel (no ``finally``, no ``atexit``) while its ranks run in a job it asked for: the ranks end
    (their stdin, srun's, ends), ``srun`` ends, and the job is given back (``salloc``'s holding command ends with the
    kernel's pipe)."""
    import os
    import signal
    import subprocess

    import psutil

    from waiting import wait_until

    script = tmp_path / "holding.py"
    script.write_text(HOLDING)
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    kernel = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    seen = []
    try:
        for line in kernel.stdout:
            seen.append(line)
            if sum("] ranks up" in text for text in seen) == 2:
                break
        assert sum("] ranks up" in text for text in seen) == 2, "".join(seen)
        assert len(cluster.jobs()) == 1
        started = [child for child in psutil.Process(kernel.pid).children(recursive=True)]
        assert {child.name() for child in started} >= {"srun", "salloc"}
    finally:
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait()
        kernel.stdout.close()
    assert cluster.wait_no_jobs(timeout=60) == [], cluster.logs()
    wait_until(lambda: not [child for child in started if child.is_running() and
                            child.status() != psutil.STATUS_ZOMBIE], timeout=60, what="srun and salloc to end")
    ranks = [pid for pid in cluster.hosts.pids() if "notebook_accel.rank.slurm_task" in _command(pid)]
    assert ranks == []


def _command(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


SESSION = textwrap.dedent('''
    import json, os, subprocess
    from notebook_accel import Session

    def where():
        import torch, torch.distributed as dist
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        return {"node": os.environ["SLURMD_NODENAME"], "rank": dist.get_rank(), "sum": total.item(),
                "pid": os.getpid()}

    def bump():
        global counter
        counter += 1

    with Session(num_processes=2, cluster="slurm", display="text") as session:
        first = session.run(where, return_all=True)
        session.push(counter=41)
        session.run(bump)
        second = session.run(where, return_all=True)
        counters = session.pull("counter")
    steps = subprocess.run(["squeue", "-h", "-s", "-j", os.environ["SLURM_JOB_ID"], "-o", "%i"], capture_output=True,
                           text=True).stdout.split()
    print("REPORT " + json.dumps({"first": first, "second": second, "counters": counters,
                                  "steps": [step for step in steps if step.split(".")[-1].isdigit()]}), flush=True)
''')


def test_a_warm_session_spans_the_allocations_nodes_with_push_and_pull(cluster, tmp_path):
    """``Session(cluster="slurm")`` inside ``salloc -N2``: one step on both nodes, the same processes across runs,
    state pushed, changed by a run, pulled back; nothing of the step left after ``close()``."""
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    done = cluster.run(["salloc", "-N2", sys.executable, str(script)], env=env, timeout=400)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(reports[0][len("REPORT "):])
    assert [(rank["node"], rank["rank"], rank["sum"]) for rank in report["first"]] == [
        (cluster.nodes[0], 0, 3.0), (cluster.nodes[1], 1, 3.0)]
    assert [rank["pid"] for rank in report["second"]] == [rank["pid"] for rank in report["first"]]   # warm
    assert report["counters"] == [42, 42]
    assert report["steps"] == []
    assert cluster.wait_no_jobs() == []


CONTRACT = test_backend_contract.checks_with_a_case()


@pytest.mark.parametrize("check", CONTRACT)
def test_the_backend_contract_holds_for_a_slurm_step(cluster, monkeypatch, check):
    """tests/test_backend_contract.py's checks on the table's "slurm" line, with pytest as the kernel on the login
    node: each launch asks for a two-node job, runs its ranks as a step of it, and gives it back."""
    import cloudpickle

    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    # The tasks import what pytest's process imports, but not a test module: its functions travel by value.
    cloudpickle.register_pickle_by_value(test_backend_contract)
    try:
        getattr(test_backend_contract, check)("slurm")
    finally:
        cloudpickle.unregister_pickle_by_value(test_backend_contract)
    assert cluster.wait_no_jobs() == []


def test_max_restarts_runs_a_new_step_of_the_same_job_after_a_failure(cluster, monkeypatch):
    """Rank 1 fails in the first attempt: the launch runs a second step in the job it asked for, which finishes;
    with no restart left, the first failure is the launch's."""
    from notebook_accel import notebook_launcher

    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def fails_first():
        import os
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        if attempt == 0 and os.environ["RANK"] == "1":
            raise ValueError("the first attempt fails")
        return {"attempt": attempt, "job": os.environ["SLURM_JOB_ID"], "step": os.environ["SLURM_STEP_ID"]}

    ranks = notebook_launcher(fails_first, num_processes=2, num_nodes=2, cluster="slurm", display="none",
                              max_restarts=1, return_all=True)
    assert [rank["attempt"] for rank in ranks] == [1, 1]
    assert len({(rank["job"], rank["step"]) for rank in ranks}) == 1 and ranks[0]["step"] != "0"  # a second step
    with pytest.raises(ValueError, match="the first attempt fails"):
        notebook_launcher(fails_first, num_processes=2, num_nodes=2, cluster="slurm", display="none")
    assert cluster.wait_no_jobs() == []


# ------------------------------------------------------------------------------------- stop, stacks, Ctrl-C

CONTROL = textwrap.dedent('''
    import json, os, signal, subprocess, sys, threading, time
    import psutil

    def listening():   # this process's listening sockets
        return {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN}

    inherited = listening()   # salloc's own (its child inherits them), before anything of ours is imported
    from notebook_accel import notebook_launcher, start_launch

    def steps():
        listed = subprocess.run(["squeue", "-h", "-s", "-j", os.environ["SLURM_JOB_ID"], "-o", "%%i"],
                                capture_output=True, text=True).stdout.split()
        return [step for step in listed if not step.endswith((".extern", ".interactive", ".batch"))]

    def wait_here(ready):
        open(f"{ready}.{os.environ['RANK']}", "w").close()
        time.sleep(600)

    def all_ready(ready):
        deadline = time.monotonic() + 240
        while not all(os.path.exists(f"{ready}.{rank}") for rank in (0, 1)):
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)

    class Keep:   # a view that keeps every event
        events = []

        def handle(self, event):
            self.events.append(event)

        def tick(self):
            pass

    def sampled():   # the ranks whose own memory sample (taken on their node) reached the kernel
        return sorted({event.rank for event in Keep.events if type(event).__name__ == "ResourceSample" and event.rss})

    report = {}
    ready = "%(ready)s/stop"
    job = start_launch(wait_here, args=(ready,), num_processes=2, num_nodes=2, cluster="slurm", display="none",
                       view=Keep())
    all_ready(ready)
    deadline = time.monotonic() + 60
    while sampled() != [0, 1] and time.monotonic() < deadline:
        time.sleep(0.2)
    report["sampled"] = sampled()
    report["hosts"] = {event.rank: event.host for event in Keep.events if type(event).__name__ == "RankStarted"}
    report["listening"] = sorted(listening() - inherited)
    report["stacks"] = job.dump_stacks()
    job.stop()
    try:
        job.wait(120)
    except KeyboardInterrupt:
        report["stopped"] = True
    report["steps_after_stop"] = steps()

    ready = "%(ready)s/interrupt"
    threading.Thread(target=lambda: (all_ready(ready), os.kill(os.getpid(), signal.SIGINT)), daemon=True).start()
    try:
        notebook_launcher(wait_here, args=(ready,), num_processes=2, num_nodes=2, cluster="slurm", display="text")
    except KeyboardInterrupt as interrupted:
        report["interrupted"] = str(interrupted)
    report["steps_after_interrupt"] = steps()
    print("REPORT " + json.dumps(report), flush=True)
''')


def test_stop_stacks_and_ctrl_c_of_a_launch_on_slurm_leave_no_step(cluster, tmp_path):
    """From a kernel inside a two-node allocation: each rank's row has its node and its memory (sampled on the node),
    ``dump_stacks`` shows where each rank on its node is, Stop ends
    the step (``wait`` raises KeyboardInterrupt), Jupyter's interrupt (SIGINT) does too — and the kernel listens on
    no port meanwhile (events come through srun's stdio, Slurm's own munge-authenticated channel)."""
    script = tmp_path / "control.py"
    script.write_text(CONTROL % {"ready": str(tmp_path)})
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    done = cluster.run(["salloc", "-N2", "-n2", sys.executable, str(script)], env=env, timeout=500)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{cluster.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert sorted(report["stacks"]) == ["0", "1"], report["stacks"]
    assert all("in wait_here" in text for text in report["stacks"].values()), report["stacks"]
    assert report["listening"] == []
    assert report["hosts"] == {"0": cluster.nodes[0], "1": cluster.nodes[1]}   # the rows' node names
    assert report["sampled"] == [0, 1]                                           # and their memory
    assert report.get("stopped") and report["steps_after_stop"] == []
    assert "interrupted" in report and report["steps_after_interrupt"] == []
    assert cluster.wait_no_jobs() == []
