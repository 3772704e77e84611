"""Ranks on a Ray cluster: notebook_accel's ``cluster="ray"`` vs plain Ray actors vs Ray Train's ``TorchTrainer``;
on Slurm, ``cluster="slurm"`` vs ``srun`` of a plain torch script.

    python benchmarks/bench_cluster.py                     # a fake 2-node cluster on this machine (2 CPUs a node)
    python benchmarks/bench_cluster.py --address auto      # the cluster of this machine (``ray start``)
    python benchmarks/bench_cluster.py --client            # the fake cluster through Ray Client (``ray://``)
    salloc -N2 python benchmarks/bench_cluster.py --slurm  # inside a 2-node Slurm allocation (outside: asks for one)
    python benchmarks/bench_cluster.py --sweep             # on a Slurm login node: sweep vs submitit's map_array
    python benchmarks/bench_cluster.py --slurm-test-cluster  # all three, on the tests' Slurm cluster (root)
    python benchmarks/bench_cluster.py --slurm-test-cluster --load 6  # and the warm run beside 6 busy loops
    python benchmarks/bench_cluster.py --slurm-test-cluster --sweep  # the sweep alone, there
    python benchmarks/bench_cluster.py --slurm-test-cluster --reattach  # reattach time vs submitit, there

For each tool, 2 ranks with ``SPREAD`` placement (one per node where Ray can):

- **start**: from the call to every rank inside the function (placement group, actors, imports);
- **first all-reduce**: from the call to every rank past its first gloo all-reduce across the nodes;
- **warm run**: one more call on ranks already up (a ``Session.run`` / an actor method on every actor), median;
- **load apart**, **load in kernel's session** (``--slurm --load N``): the warm run again beside N busy-loop processes,
  in a session of their own (as ``stress`` run from another terminal), then in the kernel's own session (its
  children). Linux's autogroup shares the cores between sessions first: in the kernel's session the loops take
  turns with the kernel's own threads (the one reading ``srun``'s stdout, the one supervising the run);
- **output**: each rank prints 20 near-identical lines 20 ms apart; how many of the 40 reach the kernel (notebook's
  process) within 10 s, and their median latency from ``print`` to arrival. Plain actors' lines come through Ray's
  log forwarding (deduplicated by default), ours through each actor's control thread.

``TorchTrainer`` runs only where ``ray.train.torch`` imports (``pip install "ray[train]"``); its start includes
Ray Train's own controller. All on the same cluster, in one run, one tool after the other.

Measured on this 2-core machine, quiet (load average 1.2-1.7), fake 2-node cluster, ray 2.60 with ``ray[train]``,
torch 2.13 CPU, 2026-11-27 (second of two runs each; docs/benchmarks.md has both):

    direct                       start  first all-reduce  whole call  warm run                      output
    notebook_accel              2.11 s            2.82 s      2.85 s      5 ms    40/40 lines, median 2 ms
    plain Ray actors            1.67 s            2.78 s      2.80 s      2 ms    3/40 lines, median 39 ms
    Ray Train TorchTrainer     17.79 s           17.79 s     20.78 s         —                           —

    --client (ray://)            start  first all-reduce  whole call  warm run                      output
    notebook_accel              3.40 s            4.02 s      4.09 s     18 ms    40/40 lines, median 9 ms
    plain Ray actors            1.57 s            2.53 s      2.55 s      6 ms   40/40 lines, median 57 ms
    Ray Train TorchTrainer     18.04 s           18.04 s     20.94 s         —                           —

Slurm (``--slurm-test-cluster``: tests/slurm_cluster.py's cluster, slurmctld here and a slurmd per network namespace;
inside ``salloc -N2``, then from the login node where each tool asks for a job), quiet (load average 0.8-1.2),
2026-11-28; docs/benchmarks.md has both runs:

    --slurm, inside salloc -N2   start  first all-reduce  whole call  warm run
    notebook_accel              2.43 s            2.44 s      2.52 s     46 ms
    plain srun + torch          114 ms            2.38 s      3.31 s         —

    --slurm, from the login node   queue wait     start  first all-reduce  whole call  warm run
    notebook_accel                     77 ms    2.47 s            2.47 s      2.66 s      9 ms
    plain srun + torch                 78 ms     49 ms            2.68 s      3.79 s         —

The warm runs above waited 40 ms on Slurm's stdio (Nagle's algorithm and a delayed ACK; docs/benchmarks.md, "A warm
run on Slurm"): 2 ms now, quiet; with ``--load 6`` beside other work, 3-11 ms with the loops apart and 35-52 ms in
the kernel's session (before: 14-53 and 70-115 ms), 2026-11-29.

``--sweep`` (from the login node, 2026-11-29; five runs, the first three under load 3.6-5.7, then 2.6-3.2): four
one-rank trials of 1 s each, 2 at a time, as one job array each — ours ``sweep(cluster="slurm")``, submitit 1.5.4's
``map_array``:

    sweep of 4, 2 at a time                      whole call  most at once                    ratio
    notebook_accel sweep      10.90 / 8.03 / 7.94 / 8.16 / 7.11 s       2   1.09 / 0.62 / 0.79 / 1.16 / 0.89
    submitit map_array       10.04 / 13.05 / 10.03 / 7.03 / 8.03 s      2   1.00

``--reattach`` (from the login node, 2026-11-29, load average 6-7 from other work; two runs): a finished detached job
of 2 ranks on 2 nodes, 2,000 lines and 200 metrics each, read whole from a new process, three times each — ours
``attach(id)`` to the dashboard holding every event, submitit's ``SlurmJob(folder, id).results()`` and both logs:

    reattach, 2 ranks finished    new process to all    median   ratio
    notebook_accel attach         3 / 3 / 3; 15 / 6 / 12 ms   3; 12 ms   4.75; 10.10
    submitit results + logs       1 / 1 / 1;  5 / 1 / 1 ms    1;  1 ms   1.00

"start" differs in meaning: a plain task stamps before it imports torch, ours once the function runs (torch imported
in the task first, the store hosted by rank 0). The queue wait is measured alike for both (``squeue`` every 50 ms);
the other columns count from the job's start.

Plain actors' other lines came after the 10 s window, folded by Ray into one "[repeated Nx across cluster]" line
labelled by pid. Ours reached the first all-reduce at 3.6 s before each actor imported torch.distributed in a
thread as it starts (rank 0 imported it to host the store while the others waited, then each in turn).
"""
from __future__ import annotations

import argparse
import io
import os
import socket
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional

LINES = 20
PREFIX = "latency-probe"


# ------------------------------------------------------------------------------------- what every rank runs

def first_all_reduce(rank: Optional[int] = None, world: Optional[int] = None, init_method: Optional[str] = None):
    """Stamp entry, join the group (torchrun's variables, or the given rank/world/address), all-reduce, stamp."""
    entered = time.time()
    import torch
    import torch.distributed as dist

    joined = not dist.is_initialized()  # Ray Train's workers are in their group before the loop starts
    if joined and init_method is None:
        dist.init_process_group("gloo")
    elif joined:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    value = torch.ones(1)
    dist.all_reduce(value)
    ready = time.time()
    if joined:
        dist.destroy_process_group()
    return entered, ready


def chatter() -> None:
    """Near-identical lines, each carrying the time it was printed."""
    for _ in range(LINES):
        print(f"{PREFIX} {time.time():.6f}", flush=True)
        time.sleep(0.02)


def noop() -> None:
    return None


# ----------------------------------------------------------------------------------------------- the tools

def bench_ours(repeats: int) -> Dict[str, Any]:
    from notebook_accel import Session, notebook_launcher, start_launch

    started = time.time()
    stamps = notebook_launcher(first_all_reduce, num_processes=2, cluster="ray", placement="SPREAD",
                               return_all=True, display="none")
    figures = _start_figures(started, stamps)

    arrivals = _Arrivals()
    job = start_launch(chatter, num_processes=2, cluster="ray", placement="SPREAD", display="none", view=arrivals)
    job.wait(600)
    figures["output"] = arrivals.summary()

    with Session(num_processes=2, cluster="ray", placement="SPREAD", display="none") as session:
        session.run(noop)
        figures["warm run"] = _median_seconds(lambda: session.run(noop), repeats)
    return figures


def bench_plain(ray: Any, repeats: int) -> Dict[str, Any]:
    """Ray actors as one writes them by hand: a placement group, an actor per bundle, a TCP init_method."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    class Worker:
        def address(self):
            with socket.socket() as sock:  # a free port on rank 0's node (released: the usual race)
                sock.bind(("", 0))
                return ray.util.get_node_ip_address(), sock.getsockname()[1]

        def run(self, function, *args):
            return function(*args)

    started = time.time()
    group = placement_group([{"CPU": 1}] * 2, strategy="SPREAD")
    ray.get(group.ready())
    actor_class = ray.remote(num_cpus=1)(Worker)
    actors = [actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=index)).remote() for index in range(2)]
    try:
        host, port = ray.get(actors[0].address.remote())
        stamps = ray.get([actor.run.remote(first_all_reduce, rank, 2, f"tcp://{host}:{port}")
                          for rank, actor in enumerate(actors)])
        figures = _start_figures(started, stamps)
        figures["warm run"] = _median_seconds(lambda: ray.get([actor.run.remote(noop) for actor in actors]), repeats)
        with _StdoutArrivals() as arrivals:  # Ray's log forwarding prints into this process's stdout
            ray.get([actor.run.remote(chatter) for actor in actors])
            time.sleep(10.0)
        figures["output"] = arrivals.summary()
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)
    return figures


def bench_torch_trainer(ray: Any) -> Dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    stamps = Queue()  # each worker's stamps (Ray Train 2.60's result keeps no metrics reported without a checkpoint)

    def loop(config):
        config["stamps"].put(first_all_reduce())

    started = time.time()
    trainer = TorchTrainer(loop, train_loop_config={"stamps": stamps},
                           scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
                           run_config=RunConfig(storage_path=os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"),
                                                                          "bench_cluster_train")))
    trainer.fit()
    ended = time.time()
    figures = _start_figures(started, [stamps.get(timeout=60) for _ in range(2)])
    stamps.shutdown()
    return dict(figures, **{"whole call": ended - started, "warm run": None, "output": None})


# ------------------------------------------------------------------------------------------------- helpers

def _start_figures(started: float, stamps: List[Any]) -> Dict[str, Any]:
    return {"start": max(entered for entered, _ in stamps) - started,
            "first all-reduce": max(ready for _, ready in stamps) - started,
            "whole call": time.time() - started}


def _median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        begun = time.perf_counter()
        call()
        times.append(time.perf_counter() - begun)
    return statistics.median(times)


class _Arrivals:
    """A launch's view: when each probe line reached the kernel."""

    def __init__(self) -> None:
        self.latencies: List[float] = []

    def handle(self, event: Any) -> None:
        now = time.time()
        for line in getattr(event, "lines", None) or [getattr(event, "text", "")]:
            if line.startswith(PREFIX):
                self.latencies.append(now - float(line.split()[1]))

    def tick(self) -> None:
        pass

    def summary(self) -> str:
        return _latency_text(self.latencies)


class _StdoutArrivals(io.TextIOBase):
    """This process's stdout while plain actors print: Ray's forwarded lines, timed as they are written."""

    def __init__(self) -> None:
        self.latencies: List[float] = []
        self._lock = threading.Lock()

    def __enter__(self) -> "_StdoutArrivals":
        self._saved = sys.stdout
        sys.stdout = self
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stdout = self._saved

    def write(self, text: str) -> int:
        now = time.time()
        with self._lock:
            for line in text.splitlines():
                if PREFIX in line:
                    stamp = line.split(PREFIX, 1)[1].split()[0]
                    self.latencies.append(now - float(stamp))
        return len(text)

    def summary(self) -> str:
        return _latency_text(self.latencies)


def _latency_text(latencies: List[float]) -> str:
    if not latencies:
        return f"0/{2 * LINES} lines"
    return f"{len(latencies)}/{2 * LINES} lines, median {statistics.median(latencies) * 1000:.0f} ms"


def _fake_cluster(client_port: Optional[int] = None) -> Any:
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 2, "include_dashboard": False}
    if client_port is not None:  # the head's Ray Client server (ray://), as KubeRay's head offers on 10001
        head["ray_client_server_port"] = client_port
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    return cluster


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ------------------------------------------------------------------------------------------------ Slurm

PLAIN_SRUN_TASK = """
import json, os, socket, sys, time
entered = time.time()
import torch, torch.distributed as dist
master, port = sys.argv[1], sys.argv[2]
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:   # gloo's interface, as one must set it by hand here
    probe.connect((master, 9)); mine = probe.getsockname()[0]
import psutil
os.environ.setdefault("GLOO_SOCKET_IFNAME", next(name for name, entries in psutil.net_if_addrs().items()
                                                 if any(entry.address == mine for entry in entries)))
dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=int(os.environ["SLURM_PROCID"]),
                        world_size=int(os.environ["SLURM_NTASKS"]))
value = torch.ones(1); dist.all_reduce(value)
print(json.dumps([entered, time.time()]), flush=True)
dist.destroy_process_group()
"""


class _QueueWatch:
    """When a job named ``name`` started RUNNING, as ``squeue`` says (asked every 50 ms from a thread): the same
    measure of the queue wait for ours and for plain ``salloc``."""

    def __init__(self, name: str) -> None:
        import subprocess

        self.running_at: Optional[float] = None
        self._stop = threading.Event()

        def watch() -> None:
            while not self._stop.is_set() and self.running_at is None:
                states = subprocess.run(["squeue", "-h", "-n", name, "-o", "%T"], capture_output=True,
                                        text=True).stdout.split()
                if "RUNNING" in states:
                    self.running_at = time.time()
                self._stop.wait(0.05)

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _with_queue_wait(started: float, figures: Dict[str, Any], watch: Optional[_QueueWatch]) -> Dict[str, Any]:
    """The figures with the queue wait apart: "start" and "first all-reduce" counted from the job's start."""
    if watch is None:
        return figures
    watch.stop()
    granted = watch.running_at if watch.running_at is not None else started
    return {"queue wait": granted - started, **{name: value - (granted - started) if name != "whole call" else value
                                                for name, value in figures.items()}}


def slurm_all_reduce_noop() -> None:
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)


def bench_slurm_ours(nodes: int, repeats: int, request: Optional[Dict[str, str]], load: int = 0) -> Dict[str, Any]:
    """Ours on Slurm; with ``load``, the warm run again with that many busy loops beside, apart and in the kernel's
    session."""
    from bench_launch import busy_loops
    from notebook_accel import Session, notebook_launcher

    watch = _QueueWatch("notebook_accel:first_all_reduce") if request else None
    started = time.time()
    stamps = notebook_launcher(first_all_reduce, num_processes=nodes, num_nodes=nodes, cluster="slurm",
                               return_all=True, display="none", slurm=request)
    figures = _with_queue_wait(started, _start_figures(started, stamps), watch)
    with Session(num_processes=nodes, num_nodes=nodes, cluster="slurm", display="none", slurm=request) as session:
        session.run(slurm_all_reduce_noop)
        figures["warm run"] = _median_seconds(lambda: session.run(slurm_all_reduce_noop), repeats)
        for column, own_session in (("load apart", True), ("load in kernel's session", False)):
            if load:
                with busy_loops(load, own_session=own_session):
                    time.sleep(2.0)   # the loops up to speed, the load average climbing
                    figures[column] = _median_seconds(lambda: session.run(slurm_all_reduce_noop), repeats)
    return figures


def bench_slurm_plain(nodes: int, request: Optional[Dict[str, str]]) -> Dict[str, Any]:
    """``srun`` of a plain torch script, as one writes it by hand: MASTER_ADDR the first node's address (its
    ``NodeAddr``: the node names need not resolve), a fixed port, gloo's interface found by the route to it. Outside
    an allocation, ``salloc`` around it (as our launch asks for its job)."""
    import json
    import subprocess

    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", sys.executable, "-c",
            PLAIN_SRUN_TASK, "$MASTER", str(29500 + os.getpid() % 1000)]
    # The first node's address, looked up inside the job (its nodes are known only once it runs).
    script = ('MASTER=$(scontrol show node "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)" '
              '| grep -o "NodeAddr=[^ ]*" | cut -d= -f2) && exec ' + " ".join(_quoted(arg) for arg in srun))
    argv = ["sh", "-c", script]
    watch = None
    if request:
        argv = ["salloc", f"--nodes={nodes}", "--job-name=plain-salloc"] + [
            f"--{key}={value}" for key, value in request.items()] + argv
        watch = _QueueWatch("plain-salloc")
    started = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    stamps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    return _with_queue_wait(started, _start_figures(started, stamps), watch)


def _quoted(arg: str) -> str:
    import shlex

    return arg if arg == "$MASTER" else shlex.quote(arg)


def main_slurm(nodes: int, repeats: int, load: int = 0) -> Dict[str, Dict[str, Any]]:
    """Inside an allocation: a step of it; outside one (a login node): each tool asks for a job of its own."""
    import torch.distributed  # noqa: F401  (warm, as a notebook kernel that already imported torch)

    request = None if os.environ.get("SLURM_JOB_ID") else {"time": "00:10:00"}
    return {"notebook_accel": bench_slurm_ours(nodes, repeats, request, load),
            "plain srun + torch": bench_slurm_plain(nodes, request)}


# ------------------------------------------------------------------------------------------ Slurm: a sweep

SWEEP_CONFIGS = [1, 2, 3, 4]
SWEEP_AT_ONCE = 2
SWEEP_TRIAL_SECONDS = 1.0


def sweep_trial(config: int) -> List[float]:
    """One trial of the sweep: a second of "training" after torch's import; its config doubled and when it ran."""
    entered = time.time()
    import torch

    time.sleep(SWEEP_TRIAL_SECONDS)
    return [float(torch.tensor(config * 2.0)), entered, time.time()]


def _sweep_figures(started: float, results: List[List[float]]) -> Dict[str, Any]:
    assert [value for value, _, _ in results] == [config * 2.0 for config in SWEEP_CONFIGS], results
    spans = [(entered, ended) for _, entered, ended in results]
    return {"whole call": time.time() - started,
            "most at once": max(sum(1 for start, end in spans if start <= moment < end) for moment, _ in spans)}


def bench_sweep_ours(request: Dict[str, str]) -> Dict[str, Any]:
    """``sweep`` of 4 one-rank trials from the login node: one job array, 2 tasks at a time."""
    from notebook_accel import sweep

    started = time.time()
    results = sweep(sweep_trial, SWEEP_CONFIGS, num_processes=1, cluster="slurm", max_concurrent=SWEEP_AT_ONCE,
                    slurm=request, display="none")
    return _sweep_figures(started, results)


def bench_sweep_submitit(request: Dict[str, str], folder: str) -> Dict[str, Any]:
    """submitit's ``map_array``: the same trials as one job array, 2 tasks at a time, results read from its folder."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(array_parallelism=SWEEP_AT_ONCE, time=5, **{key: value for key, value in
                                                                            request.items() if key != "time"})
    started = time.time()
    jobs = executor.map_array(sweep_trial, SWEEP_CONFIGS)
    return _sweep_figures(started, [job.result() for job in jobs])


def main_sweep() -> None:
    """The sweep's table: ours beside submitit's ``map_array``, and ours as a ratio of it."""
    import shutil
    import tempfile

    import torch  # noqa: F401  (warm, as a notebook kernel that already imported torch)

    request = {"time": "00:05:00"}
    folder = tempfile.mkdtemp(prefix="bench-submitit-", dir=os.getcwd())   # seen by every node (as the home is)
    try:
        ours = bench_sweep_ours(request)
        theirs = bench_sweep_submitit(request, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'sweep of 4, 2 at a time':28}{'whole call':>12}{'most at once':>14}{'ratio':>8}")
    for tool, figures in (("notebook_accel sweep", ours), ("submitit map_array", theirs)):
        print(f"{tool:28}{figures['whole call']:>10.2f} s{figures['most at once']:>14}"
              f"{figures['whole call'] / theirs['whole call']:>8.2f}")


# ------------------------------------------------------------------------------- Slurm: reattaching to a job

REATTACH_LINES = 2000      # lines per rank
REATTACH_METRICS = 200     # metric reports per rank
REATTACH_REPEATS = 3       # new processes timed per tool

# A new process (a restarted kernel): attach to the finished detached job and time it until its dashboard (the text
# one: no kernel here for widgets) has every event; stdout is kept out of the figure's way in memory.
REATTACH_OURS = """
import contextlib, io, sys, time
import notebook_accel
from notebook_accel.detached.attaching import source_of
source = source_of(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()) as shown:
    started = time.perf_counter()
    notebook_accel.attach(sys.argv[1], display="text")
    took = time.perf_counter() - started
events = len(source.read(0)[0])
lines = shown.getvalue().count("] line ")
print("TOOK", took, events, lines)
"""

# submitit's reading of the same finished job: every task's result and log.
REATTACH_SUBMITIT = """
import sys, time
import submitit
started = time.perf_counter()
job = submitit.SlurmJob(sys.argv[1], sys.argv[2], tasks=(0, 1))
job.results()
lines = sum(job.task(task).stdout().count("line ") for task in (0, 1))
took = time.perf_counter() - started
print("TOOK", took, 0, lines)
"""


def chatty_rank(report_metrics: bool) -> Dict[str, Any]:
    """A rank of a long job, in short: ``REATTACH_LINES`` lines and ``REATTACH_METRICS`` metrics (printed for a tool
    without ``report``)."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    for number in range(REATTACH_LINES):
        print(f"line {number} of rank {rank}")
    for step in range(REATTACH_METRICS):
        if report_metrics:
            from notebook_accel import report

            report(step=step, loss=1.0 / (step + 1))
        else:
            print(f"step={step} loss={1.0 / (step + 1)}")
    return {"rank": rank}


def _timed_new_processes(code: str, args: List[str]) -> Dict[str, Any]:
    import subprocess

    took, events, lines = [], 0, 0
    for _ in range(REATTACH_REPEATS):
        done = subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True, check=True)
        (row,) = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("TOOK ")]
        took.append(float(row[0]))
        events, lines = int(row[1]), int(row[2])
    assert lines >= 2 * REATTACH_LINES, (lines, done.stdout[-2000:], done.stderr[-2000:])
    return {"median": statistics.median(took), "all": took, "events": events, "lines": lines}


def main_reattach() -> None:
    """Reattach time: a finished detached job of 2 ranks on 2 nodes (``REATTACH_LINES`` lines and
    ``REATTACH_METRICS`` metrics each), read whole from a new process — ours ``attach(id)`` to the dashboard holding
    every event, submitit's ``SlurmJob(folder, id).results()`` and every task's log — and ours as a ratio of it."""
    import shutil
    import tempfile

    import submitit

    from notebook_accel import start_launch

    job = start_launch(chatty_rank, (True,), num_processes=2, num_nodes=2, cluster="slurm",
                       slurm={"time": "00:05:00"}, detach=True)
    folder = tempfile.mkdtemp(prefix="bench-submitit-", dir=os.getcwd())   # seen by every node (as the home is)
    try:
        job.wait(600)
        ours = _timed_new_processes(REATTACH_OURS, [job.id])
        executor = submitit.SlurmExecutor(folder=folder)
        executor.update_parameters(nodes=2, ntasks_per_node=1, time=5)
        theirs_job = executor.submit(chatty_rank, False)
        theirs_job.results()
        theirs = _timed_new_processes(REATTACH_SUBMITIT, [folder, theirs_job.job_id])
    finally:
        job.forget()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'reattach, 2 ranks finished':28}{'new process to all':>20}{'median':>10}{'ratio':>8}")
    for tool, figures in (("notebook_accel attach", ours), ("submitit results + logs", theirs)):
        times = " / ".join(f"{took * 1000:.0f}" for took in figures["all"])
        print(f"{tool:28}{times + ' ms':>20}{figures['median'] * 1000:>7.0f} ms"
              f"{figures['median'] / theirs['median']:>8.2f}")
    print(f"(ours: {ours['events']} events replayed, {ours['lines']} lines shown; submitit: {theirs['lines']} "
          f"lines read)")


def on_the_tests_slurm_cluster(argv: List[str], only: Optional[str] = None) -> None:
    """This benchmark's ``--slurm`` runs on tests/slurm_cluster.py's cluster (root; Debian's Slurm and munge): once
    inside a 2-node allocation, once from the login node; then ``--sweep`` and ``--reattach`` from the login node
    (``only``: one of those two alone)."""
    import subprocess

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
    from real_hosts import RealHosts
    from slurm_cluster import SlurmCluster

    here = [sys.executable, os.path.abspath(__file__)]
    runs = [("--slurm, inside salloc -N2", ["salloc", "-N2"] + here + ["--slurm"] + argv),
            ("--slurm, from the login node", here + ["--slurm"] + argv),
            ("--sweep, from the login node", here + ["--sweep"]),
            ("--reattach, from the login node", here + ["--reattach"])]
    with RealHosts(2) as hosts, SlurmCluster(hosts) as cluster:
        for title, command in runs if only is None else [run for run in runs if run[1][-1] == only]:
            print(title, flush=True)
            subprocess.run(command, env=cluster.env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", help="a Ray cluster to use (default: a fake 2-node one on this machine)")
    parser.add_argument("--repeats", type=int, default=10, help="warm runs timed per tool")
    parser.add_argument("--client", action="store_true",
                        help="reach the fake cluster through Ray Client (ray://), as a notebook outside its network")
    parser.add_argument("--slurm", action="store_true",
                        help="on Slurm, 2 nodes: cluster='slurm' vs srun of a plain torch script (inside an allocation "
                             "as a step of it; outside one, each asks for a job)")
    parser.add_argument("--sweep", action="store_true",
                        help="on Slurm, from the login node: a sweep of 4 one-rank trials, 2 at a time, as a job "
                             "array: notebook_accel's sweep vs submitit's map_array (with --slurm-test-cluster: only "
                             "this, on that cluster)")
    parser.add_argument("--reattach", action="store_true",
                        help="on Slurm, from the login node: a finished detached job read whole from a new process: "
                             "notebook_accel's attach vs submitit's results and logs (with --slurm-test-cluster: only "
                             "this, on that cluster)")
    parser.add_argument("--slurm-test-cluster", action="store_true",
                        help="--slurm on tests/slurm_cluster.py's cluster, inside and outside an allocation, then "
                             "--sweep (root)")
    parser.add_argument("--load", type=int, default=0,
                        help="with --slurm: the warm run again beside this many busy loops, apart and in the "
                             "kernel's session")
    options = parser.parse_args()

    if options.slurm_test_cluster:
        only = "--sweep" if options.sweep else "--reattach" if options.reattach else None
        on_the_tests_slurm_cluster([f"--repeats={options.repeats}", f"--load={options.load}"], only=only)
        return
    if options.reattach:
        main_reattach()
        return
    if options.sweep:
        main_sweep()
        return
    if options.slurm:
        _print_table(main_slurm(2, options.repeats, options.load))
        return
    import ray

    client_port = _free_port() if options.client and not options.address else None
    cluster = None if options.address else _fake_cluster(client_port)
    if client_port is not None:
        ray.init(f"ray://127.0.0.1:{client_port}", logging_level="ERROR")
    else:
        ray.init(address=options.address or cluster.address, logging_level="ERROR")
    import torch.distributed  # noqa: F401  (warm, as a notebook kernel that already imported torch)
    try:
        results = {"notebook_accel": bench_ours(options.repeats), "plain Ray actors": bench_plain(ray, options.repeats)}
        try:
            import ray.train.torch  # noqa: F401
        except ImportError as err:
            print(f"(Ray Train's TorchTrainer left out: {err})")
        else:
            results["Ray Train TorchTrainer"] = bench_torch_trainer(ray)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    _print_table(results)


def _print_table(results: Dict[str, Dict[str, Any]]) -> None:
    columns = ["start", "first all-reduce", "whole call", "warm run", "output"]
    widths = [10, 18, 12, 10, 28]
    if any("queue wait" in figures for figures in results.values()):
        columns, widths = ["queue wait"] + columns[:-1], [12] + widths[:-1]
    elif not any("output" in figures for figures in results.values()):
        columns, widths = columns[:-1], widths[:-1]
    if any("load apart" in figures for figures in results.values()):
        columns, widths = columns + ["load apart", "load in kernel's session"], widths + [12, 26]
    print(f"{'':24}" + "".join(f"{column:>{width}}" for column, width in zip(columns, widths)))
    for tool, figures in results.items():
        cells = []
        for column in columns:
            value = figures.get(column)
            cells.append("—" if value is None else value if isinstance(value, str) else f"{value * 1000:.0f} ms"
                         if value < 1 else f"{value:.2f} s")
        print(f"{tool:24}" + "".join(f"{cell:>{width}}" for cell, width in zip(cells, widths)))


if __name__ == "__main__":
    main()
