"""Warm ranks (``Session``) vs a fresh launch, ours and accelerate's, side by side in one run.

    python benchmarks/bench_session.py [--repeats 30] [--load 2.0] [--train 1.0]

Rows:
- a trivial task on 2 warm CPU ranks: ``session.run`` and a ``%%ranks`` cell (``session.execute``), against a
  fresh ``notebook_launcher`` call of ours (fork) and accelerate's ``notebook_launcher`` (goal, issue 14: a warm
  run ≤ 3 ms median);
- "the second experiment": a function that loads a model (``--load`` s) and then trains (``--train`` s), tried
  twice. With a session the load runs once and the second try is the training alone; a launcher pays the load
  (and its start) every time.
- data to and from 2 warm ranks (``--megabytes`` float32 each, 100 by default): ``pull`` of a tensor and of a numpy
  array, ``push`` of a fresh tensor, two return values of ``session.run``, and the return values of a launch
  (against the same launch returning ``1``), beside Ray's object store when Ray is installed: 2 actors, the
  driver's ``ray.get`` of what they return and its ``ray.put`` of a fresh tensor they both take, with torch
  tensors under ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1`` and with numpy arrays (Ray's zero-copy path) by
  default (``--ray torch,torch-zero-copy,numpy`` adds Ray's default torch pickling). Ray runs in a child
  process, one node per setting of that variable (Ray reads it at import); a node that does not start and
  measure in ``--ray-timeout`` s (90) is skipped, as Ray's raylet misses its own 30 s start limit on a heavily
  loaded machine. "CPU s": the CPU seconds one operation costs the kernel and the warm ranks together (a
  loaded machine stretches the wall times, much less this). "+ read" rows also sum every value in the kernel
  (our tensors and Ray's arrays are mapped, not copied, so the first read pays the page mapping).
  Goal (issue 29): pull and return at least as fast as Ray's object store.

    python benchmarks/bench_session.py --tables data [--megabytes 100] [--data-repeats 5] [--ray torch,numpy]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing.util
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch  # noqa: F401  - imported up front, as in a notebook that trains: not part of any timing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_launch import accelerate_launcher, fds_to_devnull, timed  # noqa: E402
from notebook_accel import Session, notebook_launcher  # noqa: E402


def trivial():
    return 1


def load_model(seconds):
    global model
    time.sleep(seconds)  # stands in for reading a checkpoint, building a tokenizer, moving weights
    model = torch.nn.Linear(8, 8)


def train(seconds):
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    steps = 50  # the same on every rank: a real loop (forward, backward, an all-reduce), paced to ``seconds``
    for _ in range(steps):
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        dist.all_reduce(model.weight.grad)
        time.sleep(seconds / steps)
    return steps


def load_and_train(load_seconds, train_seconds):
    load_model(load_seconds)
    return train(train_seconds)


def make_big(elements, as_numpy=False):
    global big
    big = torch.ones(elements)
    if as_numpy:
        big = big.numpy()


def give_big():
    return big


def launch_returning(elements, give_back):
    value = torch.ones(elements)
    return value if give_back else 1


def read_all(values) -> float:
    """Sum every value (tensors or arrays): the kernel reads every byte it received."""
    return float(sum(float(value.sum()) for value in values))


def timed_fresh(make: Callable[[], object], call: Callable[[object], object], repeats: int) -> List[float]:
    """``call(make())`` timed without ``make``: each repeat sends data the ranks have not seen."""
    times = []
    for _ in range(repeats + 1):
        value = make()
        started = time.perf_counter()
        call(value)
        times.append(time.perf_counter() - started)
        del value
    return times[1:]


def cpu_seconds(pids: List[int]) -> float:
    """CPU time used so far by this process (the kernel) and the processes ``pids`` (the warm ranks): what an
    operation costs whatever else runs on the machine, unlike its wall time on a loaded one."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        used += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime, stime
    return used


def our_data_rows(elements: int, repeats: int) -> Tuple[Dict[str, List[float]], Dict[str, float]]:
    """Our rows' times, and for the session's rows the CPU seconds per operation (kernel and ranks)."""
    rows: Dict[str, List[float]] = {}
    cpu: Dict[str, float] = {}
    with Session(num_processes=2, display="none") as session:

        def measure(name: str, times: Callable[[], List[float]], calls: int) -> None:
            before = cpu_seconds(session.pids)
            rows[name] = times()
            cpu[name] = (cpu_seconds(session.pids) - before) / calls

        session.run(make_big, args=(elements,))
        measure("pull a tensor from each", lambda: timed(lambda: session.pull("big"), repeats, warmup=1),
                repeats + 1)
        measure("pull a tensor from each + read", lambda: timed(lambda: read_all(session.pull("big")), repeats),
                repeats)
        measure("two return values of run", lambda: timed(lambda: session.run(give_big, return_all=True), repeats),
                repeats)
        rows["push a fresh tensor to both"] = timed_fresh(lambda: torch.rand(elements),
                                                          lambda value: session.push(fresh=value), repeats)
        session.run(make_big, args=(elements, True))
        measure("pull a numpy array from each", lambda: timed(lambda: session.pull("big"), repeats, warmup=1),
                repeats + 1)
        measure("pull a numpy array from each + read",
                lambda: timed(lambda: read_all(session.pull("big")), repeats), repeats)
    launches = max(3, repeats // 2)
    rows["launch returning a tensor from each"] = timed(
        lambda: notebook_launcher(launch_returning, args=(elements, True), num_processes=2, return_all=True,
                                  display="none"), launches, warmup=1)
    rows["the same launch returning 1"] = timed(
        lambda: notebook_launcher(launch_returning, args=(elements, False), num_processes=2, return_all=True,
                                  display="none"), launches, warmup=1)
    return rows, cpu


RAY_VARIANTS = {"torch": "torch tensors", "torch-zero-copy": "torch, zero-copy on", "numpy": "numpy arrays"}
ZERO_COPY_VARIABLE = "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"   # Ray reads it at import: one Ray node per setting


def ray_data_rows(variants: List[str], elements: int, repeats: int,
                  timeout: float) -> Dict[str, Optional[Dict[str, List[float]]]]:
    """Ray's rows per variant, measured in child processes, one Ray node per setting of ``ZERO_COPY_VARIABLE``
    (a variant's rows are None where Ray is not installed, or did not start or finish in ``timeout`` s: on a
    busy machine its raylet may miss its own 30 s start limit)."""
    rows: Dict[str, Optional[Dict[str, List[float]]]] = {variant: None for variant in variants}
    try:
        import ray  # noqa: F401
    except ImportError:
        return rows
    groups = [variants]   # numpy arrays go zero-copy either way: with the zero-copy torch variant if it runs
    if "torch-zero-copy" in variants and "torch" in variants:
        groups = [[variant for variant in variants if variant != "torch"], ["torch"]]
    for group in filter(None, groups):
        # Ray's own directory, short (its socket paths must fit in 107 bytes): made here, so that whatever Ray
        # started is found by it and ended, and the directory removed, however the child ended.
        ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        command = [sys.executable, os.path.abspath(__file__), "--ray-child", ",".join(group), "--ray-dir", ray_dir,
                   "--elements", str(elements), "--repeats", str(repeats)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"Ray ({', '.join(group)}): no result in {timeout:g} s (skipped)", file=sys.stderr)
            continue
        finally:
            end_processes_naming(ray_dir)
            shutil.rmtree(ray_dir, ignore_errors=True)
        found = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if found:
            rows.update(json.loads(found[-1]))
        else:
            print(f"Ray ({', '.join(group)}) failed:\n{done.stderr[-1500:]}", file=sys.stderr)
    return rows


def ray_child(variants: List[str], ray_dir: str, elements: int, repeats: int) -> None:
    """In a child process: 2 Ray actors hold the data; print each variant's rows as one JSON line."""
    env_vars = {ZERO_COPY_VARIABLE: "1"} if "torch-zero-copy" in variants else {}
    os.environ.update(env_vars)  # before Ray is imported: it reads the variable then
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")   # a local node for this child alone
    # The raylet aborts the node when its agents take over ~15 s to write their ports down (a busy machine):
    # give them the time Python's own 30 s wait for the node allows.
    os.environ.setdefault("RAY_agent_register_timeout_ms", "60000")
    import numpy
    import ray

    fix_ray_agent_ports()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=max(1 << 30, 12 * 4 * elements), runtime_env={"env_vars": env_vars},
             _temp_dir=ray_dir)

    @ray.remote
    class Rank:
        def make(self, count, as_numpy):
            self.big = numpy.ones(count, dtype=numpy.float32) if as_numpy else torch.ones(count)

        def get(self):
            return self.big

        def take(self, value):
            self.fresh = value

    results = {}
    try:
        actors = [Rank.remote() for _ in range(2)]
        for variant in variants:
            as_numpy = variant == "numpy"
            ray.get([actor.make.remote(elements, as_numpy) for actor in actors])
            fresh = (lambda: numpy.random.rand(elements).astype(numpy.float32)) if as_numpy else \
                (lambda: torch.rand(elements))
            results[variant] = {
                "pull": timed(lambda: ray.get([actor.get.remote() for actor in actors]), repeats, warmup=1),
                "pull + read": timed(lambda: read_all(ray.get([actor.get.remote() for actor in actors])), repeats),
                "push": timed_fresh(fresh, lambda value: ray.get([actor.take.remote(reference) for reference in
                                                                [ray.put(value)] for actor in actors]), repeats),
            }
    finally:
        ray.shutdown()
    print(json.dumps(results))


def end_processes_naming(directory: str) -> None:
    """SIGKILL every process whose command line names ``directory`` (Ray's node processes and agents, which
    outlive a child killed mid-start), one by one by pid."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if directory.encode() in cmdline.read():
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass


def fix_ray_agent_ports() -> None:
    """Give Ray's node agents fixed free ports. Left to choose their own, the raylet waits ~15 s for the metrics
    agent to write its port down and aborts the node on a busy machine, where that agent takes longer to
    start ("The current node timed out during startup")."""
    import socket

    from ray._private import parameter

    def free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    original = parameter.RayParams.__init__

    def with_ports(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for name in ("metrics_agent_port", "metrics_export_port", "runtime_env_agent_port",
                     "dashboard_agent_listen_port"):
            if not getattr(self, name, None):
                setattr(self, name, free_port())

    parameter.RayParams.__init__ = with_ports


def data_table(megabytes: int, repeats: int, ray_variants: List[str], ray_timeout: float) -> None:
    elements = megabytes * (1 << 20) // 4
    ours, ours_cpu = our_data_rows(elements, repeats)
    ray_rows = ray_data_rows(ray_variants, elements, repeats, ray_timeout) if ray_variants else {}
    print(f"\nData to and from 2 warm CPU ranks, {megabytes} MiB float32 each (median s, min s)")
    ray_heads = [f"{'Ray: ' + RAY_VARIANTS[name]:>22}" for name in ray_variants]
    print(f"{'':44} {'ours':>15} {'CPU s':>6}  " + "  ".join(ray_heads))
    ray_keys = {"pull a tensor from each": "pull", "pull a tensor from each + read": "pull + read",
                "push a fresh tensor to both": "push"}

    def cell(times: Optional[List[float]], width: int) -> str:
        text = f"{statistics.median(times):.3f} ({min(times):.3f})" if times else "-"
        return f"{text:>{width}}"

    for name, times in ours.items():
        anchors = []
        for variant in ray_variants:
            found = ray_rows[variant]
            key = ray_keys.get(name) if variant != "numpy" else \
                {"pull a numpy array from each": "pull", "pull a numpy array from each + read": "pull + read",
                 "push a fresh tensor to both": "push"}.get(name)
            anchors.append(cell(found.get(key) if found and key else None, 22))
        used = f"{ours_cpu[name]:6.3f}" if name in ours_cpu else f"{'':6}"
        print(f"{name:44} {cell(times, 15)} {used}  " + "  ".join(anchors))
    fastest = {key: min((statistics.median(rows[key]) for rows in ray_rows.values() if rows), default=None)
               for key in ("pull", "push")}
    if fastest["pull"] is not None:
        for name in ("pull a tensor from each", "two return values of run"):
            median = statistics.median(ours[name])
            print(f"goal: {name} <= Ray's fastest pull ({fastest['pull']:.3f} s): {median:.3f} s -> "
                  f"{'met' if median <= fastest['pull'] else 'NOT met'}")
    extra = statistics.median(ours["launch returning a tensor from each"]) - \
        statistics.median(ours["the same launch returning 1"])
    print(f"a launch's two return values cost {extra:.3f} s beyond the same launch returning 1")


def second_try_with_session(load_seconds: float, train_seconds: float) -> float:
    with Session(num_processes=2, display="none") as session:
        session.run(load_model, args=(load_seconds,))
        session.run(train, args=(train_seconds,))          # the first experiment
        started = time.perf_counter()
        session.run(train, args=(train_seconds,))          # the second: the model is still there
        return time.perf_counter() - started


def second_try_with_launcher(launch: Callable[[], object]) -> float:
    launch()                                                # the first experiment
    started = time.perf_counter()
    launch()                                                # the second: everything again
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--load", type=float, default=2.0)
    parser.add_argument("--train", type=float, default=1.0)
    parser.add_argument("--tables", default="trivial,second,data",
                        help="which tables, comma-separated: trivial, second, data")
    parser.add_argument("--megabytes", type=int, default=100, help="MiB per rank in the data table")
    parser.add_argument("--data-repeats", type=int, default=5, help="repeats of each row in the data table")
    parser.add_argument("--ray", default="torch-zero-copy,numpy",
                        help=f"Ray's variants beside ours, comma-separated (of {', '.join(RAY_VARIANTS)}), or none")
    parser.add_argument("--ray-timeout", type=float, default=90.0,
                        help="seconds for each Ray node to start and measure before its rows are skipped")
    parser.add_argument("--ray-child", help=argparse.SUPPRESS)
    parser.add_argument("--ray-dir", help=argparse.SUPPRESS)
    parser.add_argument("--elements", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.ray_child:
        ray_child(options.ray_child.split(","), options.ray_dir, options.elements, options.repeats)
        return
    scratch = tempfile.mkdtemp(prefix="bench_session-")  # accelerate's torch elastic leaves dirs in TMPDIR
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True},
                                  exitpriority=-101)
    tables = set(options.tables.split(","))
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    if "data" in tables:
        ray_variants = [variant for variant in options.ray.split(",") if variant in RAY_VARIANTS]
        data_table(options.megabytes, options.data_repeats, ray_variants, options.ray_timeout)
    if "trivial" in tables:
        trivial_table(options.repeats)
    if "second" in tables:
        second_experiment_table(options.load, options.train)
    print(f"load average at the end: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")


def trivial_table(repeats: int) -> None:
    rows: Dict[str, Optional[List[float]]] = {}
    with Session(num_processes=2, display="none") as session:
        rows["session.run, 2 warm ranks"] = timed(lambda: session.run(trivial), repeats, warmup=3)
        rows["%%ranks cell (session.execute), 2 warm ranks"] = timed(
            lambda: session.execute("1"), repeats, warmup=3)
    rows["Session start + close, 2 ranks"] = timed(lambda: Session(num_processes=2, display="none").close(),
                                                   max(3, repeats // 5))
    rows["ours: notebook_launcher, fork"] = timed(
        lambda: notebook_launcher(trivial, num_processes=2, start_method="fork", display="none"),
        repeats, warmup=1)
    anchor = accelerate_launcher(trivial)
    rows["accelerate notebook_launcher"] = timed(anchor, max(5, repeats // 3), warmup=1) if anchor else None

    print("\nA trivial task on 2 CPU ranks")
    reference = statistics.median(rows["accelerate notebook_launcher"]) if rows["accelerate notebook_launcher"] else None
    print(f"{'':48} {'median ms':>10} {'min ms':>8} {'vs accelerate':>14}")
    for name, times in rows.items():
        if times is None:
            print(f"{name:48} {'(not installed)':>10}")
            continue
        median = statistics.median(times)
        ratio = f"{median / reference:.3f}x" if reference else "-"
        print(f"{name:48} {1000 * median:10.2f} {1000 * min(times):8.2f} {ratio:>14}")
    warm = statistics.median(rows["session.run, 2 warm ranks"])
    cell = statistics.median(rows["%%ranks cell (session.execute), 2 warm ranks"])
    print(f"goal: a warm session.run <= 3 ms median: {1000 * warm:.2f} ms -> {'met' if warm <= 0.003 else 'NOT met'}")
    print(f"goal: a warm %%ranks cell <= 3 ms median: {1000 * cell:.2f} ms -> {'met' if cell <= 0.003 else 'NOT met'}")


def second_experiment_table(load: float, train_s: float) -> None:
    second: Dict[str, Optional[float]] = {}
    second["ours: Session (load once)"] = second_try_with_session(load, train_s)
    with fds_to_devnull():
        second["ours: notebook_launcher, fork"] = second_try_with_launcher(
            lambda: notebook_launcher(load_and_train, args=(load, train_s), num_processes=2, display="none"))
    anchor_experiment = accelerate_launcher(load_and_train, (load, train_s))
    second["accelerate notebook_launcher"] = (second_try_with_launcher(anchor_experiment)
                                              if anchor_experiment else None)

    print(f"\nThe second experiment: load {load:g} s, then train {train_s:g} s (time of the second try)")
    base = second.get("accelerate notebook_launcher")
    print(f"{'':48} {'seconds':>10} {'vs accelerate':>14}")
    for name, seconds in second.items():
        if seconds is None:
            print(f"{name:48} {'(not installed)':>10}")
            continue
        ratio = f"{seconds / base:.2f}x" if base else "-"
        print(f"{name:48} {seconds:10.2f} {ratio:>14}")


if __name__ == "__main__":
    main()
