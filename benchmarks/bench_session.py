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
  tensors (Ray's default pickling, and ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1``) and with numpy arrays (Ray's
  zero-copy path). Each Ray variant runs in a child process of its own (Ray reads that variable at import).
  "+ read" rows also sum every value in the kernel (our tensors and Ray's arrays are mapped, not copied, so the
  first read pays the page mapping). Goal (issue 29): pull and return at least as fast as Ray's object store.

    python benchmarks/bench_session.py --tables data [--megabytes 100] [--repeats 10]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

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


def our_data_rows(elements: int, repeats: int) -> Dict[str, List[float]]:
    rows: Dict[str, List[float]] = {}
    with Session(num_processes=2, display="none") as session:
        session.run(make_big, args=(elements,))
        rows["pull a tensor from each"] = timed(lambda: session.pull("big"), repeats, warmup=1)
        rows["pull a tensor from each + read"] = timed(lambda: read_all(session.pull("big")), repeats)
        rows["two return values of run"] = timed(lambda: session.run(give_big, return_all=True), repeats)
        rows["push a fresh tensor to both"] = timed_fresh(lambda: torch.rand(elements),
                                                          lambda value: session.push(fresh=value), repeats)
        session.run(make_big, args=(elements, True))
        rows["pull a numpy array from each"] = timed(lambda: session.pull("big"), repeats, warmup=1)
        rows["pull a numpy array from each + read"] = timed(lambda: read_all(session.pull("big")), repeats)
    launches = max(3, repeats // 2)
    rows["launch returning a tensor from each"] = timed(
        lambda: notebook_launcher(launch_returning, args=(elements, True), num_processes=2, return_all=True,
                                  display="none"), launches, warmup=1)
    rows["the same launch returning 1"] = timed(
        lambda: notebook_launcher(launch_returning, args=(elements, False), num_processes=2, return_all=True,
                                  display="none"), launches, warmup=1)
    return rows


RAY_VARIANTS = {"torch": "torch tensors", "torch-zero-copy": "torch, zero-copy on", "numpy": "numpy arrays"}


def ray_data_rows(variant: str, elements: int, repeats: int) -> Optional[Dict[str, List[float]]]:
    """Ray's rows for one variant, measured in a child process (None: Ray is not installed or failed)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return None
    command = [sys.executable, os.path.abspath(__file__), "--ray-child", variant, "--elements", str(elements),
               "--repeats", str(repeats)]
    for _ in range(3):  # on a busy machine Ray's node may time out while starting: try again
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{"):
                return json.loads(line)
    print(f"Ray ({variant}) failed:\n{done.stderr[-2000:]}", file=sys.stderr)
    return None


def ray_child(variant: str, elements: int, repeats: int) -> None:
    """In a child process: 2 Ray actors hold the data; print their rows as one JSON line."""
    env_vars = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"} if variant == "torch-zero-copy" else {}
    os.environ.update(env_vars)  # before Ray is imported: it reads the variable then
    import numpy
    import ray

    as_numpy = variant == "numpy"
    fix_ray_agent_ports()
    # Ray's own directory, short (its socket paths must fit in 107 bytes) and removed at the end.
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 object_store_memory=max(1 << 30, 12 * 4 * elements), runtime_env={"env_vars": env_vars},
                 _temp_dir=ray_dir)
    except BaseException:
        shutil.rmtree(ray_dir, ignore_errors=True)
        raise

    @ray.remote
    class Rank:
        def make(self, count):
            self.big = numpy.ones(count, dtype=numpy.float32) if as_numpy else torch.ones(count)

        def get(self):
            return self.big

        def take(self, value):
            self.fresh = value

    try:
        actors = [Rank.remote() for _ in range(2)]
        ray.get([actor.make.remote(elements) for actor in actors])
        fresh = (lambda: numpy.random.rand(elements).astype(numpy.float32)) if as_numpy else \
            (lambda: torch.rand(elements))
        rows = {
            "pull": timed(lambda: ray.get([actor.get.remote() for actor in actors]), repeats, warmup=1),
            "pull + read": timed(lambda: read_all(ray.get([actor.get.remote() for actor in actors])), repeats),
            "push": timed_fresh(fresh, lambda value: ray.get([actor.take.remote(reference) for reference in
                                                            [ray.put(value)] for actor in actors]), repeats),
        }
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    print(json.dumps(rows))


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


def data_table(megabytes: int, repeats: int) -> None:
    elements = megabytes * (1 << 20) // 4
    ours = our_data_rows(elements, repeats)
    ray_rows = {variant: ray_data_rows(variant, elements, repeats) for variant in RAY_VARIANTS}
    print(f"\nData to and from 2 warm CPU ranks, {megabytes} MiB float32 each (median s, min s)")
    print(f"{'':44} {'ours':>15}  " + "  ".join(f"{'Ray: ' + name:>22}" for name in RAY_VARIANTS.values()))
    ray_keys = {"pull a tensor from each": "pull", "pull a tensor from each + read": "pull + read",
                "push a fresh tensor to both": "push"}

    def cell(times: Optional[List[float]], width: int) -> str:
        text = f"{statistics.median(times):.3f} ({min(times):.3f})" if times else "-"
        return f"{text:>{width}}"

    for name, times in ours.items():
        anchors = []
        for variant in RAY_VARIANTS:
            found = ray_rows[variant]
            key = ray_keys.get(name) if variant != "numpy" else \
                {"pull a numpy array from each": "pull", "pull a numpy array from each + read": "pull + read",
                 "push a fresh tensor to both": "push"}.get(name)
            anchors.append(cell(found.get(key) if found and key else None, 22))
        print(f"{name:44} {cell(times, 15)}  " + "  ".join(anchors))
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
    parser.add_argument("--ray-child", choices=sorted(RAY_VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--elements", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.ray_child:
        ray_child(options.ray_child, options.elements, options.repeats)
        return
    scratch = tempfile.mkdtemp(prefix="bench_session-")  # accelerate's torch elastic leaves dirs in TMPDIR
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True},
                                  exitpriority=-101)
    tables = set(options.tables.split(","))
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    if "data" in tables:
        data_table(options.megabytes, min(options.repeats, 10))
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
