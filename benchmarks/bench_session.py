"""Warm ranks (``Session``) vs a fresh launch, ours and accelerate's, side by side in one run.

    python benchmarks/bench_session.py [--repeats 30] [--load 2.0] [--train 1.0]

Rows:
- a trivial task on 2 warm CPU ranks: ``session.run`` and a ``%%ranks`` cell (``session.execute``), against a
  fresh ``notebook_launcher`` call of ours (fork) and accelerate's ``notebook_launcher`` (goal, issue 14: a warm
  run ≤ 3 ms median);
- "the second experiment": a function that loads a model (``--load`` s) and then trains (``--train`` s), tried
  twice. With a session the load runs once and the second try is the training alone; a launcher pays the load
  (and its start) every time.
"""
from __future__ import annotations

import argparse
import multiprocessing.util
import os
import shutil
import statistics
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
    scratch = tempfile.mkdtemp(prefix="bench_session-")  # accelerate's torch elastic leaves dirs in TMPDIR
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True},
                                  exitpriority=-101)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--load", type=float, default=2.0)
    parser.add_argument("--train", type=float, default=1.0)
    options = parser.parse_args()

    rows: Dict[str, Optional[List[float]]] = {}
    with Session(num_processes=2, display="none") as session:
        rows["session.run, 2 warm ranks"] = timed(lambda: session.run(trivial), options.repeats, warmup=3)
        rows["%%ranks cell (session.execute), 2 warm ranks"] = timed(
            lambda: session.execute("1"), options.repeats, warmup=3)
    rows["Session start + close, 2 ranks"] = timed(lambda: Session(num_processes=2, display="none").close(),
                                                   max(3, options.repeats // 5))
    rows["ours: notebook_launcher, fork"] = timed(
        lambda: notebook_launcher(trivial, num_processes=2, start_method="fork", display="none"),
        options.repeats, warmup=1)
    anchor = accelerate_launcher(trivial)
    rows["accelerate notebook_launcher"] = timed(anchor, max(5, options.repeats // 3), warmup=1) if anchor else None

    load, train_s = options.load, options.train
    second: Dict[str, Optional[float]] = {}
    second["ours: Session (load once)"] = second_try_with_session(load, train_s)
    with fds_to_devnull():
        second["ours: notebook_launcher, fork"] = second_try_with_launcher(
            lambda: notebook_launcher(load_and_train, args=(load, train_s), num_processes=2, display="none"))
    anchor_experiment = accelerate_launcher(load_and_train, (load, train_s))
    second["accelerate notebook_launcher"] = (second_try_with_launcher(anchor_experiment)
                                              if anchor_experiment else None)

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, python {sys.version.split()[0]}")
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

    print(f"\nThe second experiment: load {load:g} s, then train {train_s:g} s (time of the second try)")
    base = second.get("accelerate notebook_launcher")
    print(f"{'':48} {'seconds':>10} {'vs accelerate':>14}")
    for name, seconds in second.items():
        if seconds is None:
            print(f"{name:48} {'(not installed)':>10}")
            continue
        ratio = f"{seconds / base:.2f}x" if base else "-"
        print(f"{name:48} {seconds:10.2f} {ratio:>14}")

    warm = statistics.median(rows["session.run, 2 warm ranks"])
    cell = statistics.median(rows["%%ranks cell (session.execute), 2 warm ranks"])
    print(f"\ngoal: a warm session.run <= 3 ms median: {1000 * warm:.2f} ms -> {'met' if warm <= 0.003 else 'NOT met'}")
    print(f"goal: a warm %%ranks cell <= 3 ms median: {1000 * cell:.2f} ms -> {'met' if cell <= 0.003 else 'NOT met'}")


if __name__ == "__main__":
    main()
