"""What a launch costs when the notebook holds big data: rank private memory and launch time, side by side.

    python benchmarks/bench_payload.py [--repeats 3]

A. A 200 MiB global and a 200 MiB argument (float32 tensors built in ``__main__``, as in a notebook), read
   by 2 forked ranks: ours vs ``torch.multiprocessing.start_processes(fork)`` vs accelerate's
   ``notebook_launcher``. Private memory is each rank's USS (psutil) after reading every page, against a
   bare rank that reads a 4-element tensor. Goal (issue 7): ours <= 1.1x a bare rank's memory.
B. An 800 MiB tensor argument through the warm fork server and spawn: ours vs
   ``torch.multiprocessing.start_processes(spawn)`` (torch's shared-memory reductions). "Extra" is the
   launch time minus the same launch with a 4-element tensor: for the first launch with a new tensor (which
   moves it into shared memory, once) and again with the same tensor. Goal: warm fork server <= 1 s extra
   and no private copy.
"""
from __future__ import annotations

import argparse
import glob
import multiprocessing.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_launch import fds_to_devnull  # noqa: E402
from notebook_accel import notebook_launcher  # noqa: E402

MIB = 1 << 20
BIG_GLOBAL: Optional[torch.Tensor] = None  # set in main(): a global the launched function reads


def record_uss(out_dir: str, rank: str, *tensors: torch.Tensor) -> None:
    import psutil

    for tensor in tensors:
        tensor.sum().item()  # touch every page
    with open(os.path.join(out_dir, f"rank-{rank}"), "w") as out:
        out.write(str(psutil.Process().memory_full_info().uss / MIB))


def reads_global_and_argument(out_dir: str, argument: torch.Tensor) -> None:
    record_uss(out_dir, os.environ.get("RANK", "?"), BIG_GLOBAL, argument)


def reads_argument(out_dir: str, argument: torch.Tensor) -> None:
    record_uss(out_dir, os.environ.get("RANK", "?"), argument)


def by_torch_mp(function: Callable, method: str) -> Callable:
    """torch.multiprocessing.start_processes with ``method``; the rank index becomes RANK."""
    from torch.multiprocessing import start_processes

    def launch(*args):
        start_processes(_indexed, args=(function, args), nprocs=2, start_method=method)
    return launch


def _indexed(index: int, function: Callable, args: Tuple) -> None:
    os.environ["RANK"] = str(index)
    one_thread_after_fork(function)(*args)


def one_thread_after_fork(function: Callable) -> Callable:
    """The anchors' forked ranks hang in their first multi-threaded op once the parent ran one (GNU
    OpenMP's pool does not survive fork; ours run 1 thread for this reason): give them 1 thread too."""
    def rank(*args):
        torch.set_num_threads(1)
        function(*args)
    return rank


def by_ours(function: Callable, method: str) -> Callable:
    return lambda *args: notebook_launcher(function, args=args, num_processes=2, start_method=method,
                                           display="none")


def by_accelerate(function: Callable) -> Optional[Callable]:
    try:
        from accelerate import notebook_launcher as accelerate_launcher
    except ImportError:
        return None

    def launch(*args):
        with fds_to_devnull():
            accelerate_launcher(one_thread_after_fork(function), args=args, num_processes=2)
    return launch


def measure(launch: Callable, argument: torch.Tensor, repeats: int) -> Tuple[float, float]:
    """(median wall seconds, largest rank USS in MiB of the last run)."""
    times, uss = [], 0.0
    for _ in range(repeats):
        out_dir = tempfile.mkdtemp(prefix="uss-")
        started = time.perf_counter()
        launch(out_dir, argument)
        times.append(time.perf_counter() - started)
        uss = max(float(open(path).read()) for path in glob.glob(os.path.join(out_dir, "rank-*")))
        shutil.rmtree(out_dir)
    return statistics.median(times), uss


def main() -> None:
    global BIG_GLOBAL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    scratch = tempfile.mkdtemp(prefix="bench_payload-")  # accelerate's torchelastic_* dirs land here
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True},
                                  exitpriority=-101)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, python {sys.version.split()[0]}")

    small = torch.ones(4)
    BIG_GLOBAL = torch.ones(50 * MIB)       # 200 MiB
    argument = torch.ones(50 * MIB)         # 200 MiB
    print("\nA. 200 MiB global + 200 MiB argument, 2 forked ranks")
    print(f"{'':40} {'launch s':>9} {'rank MiB':>9} {'bare MiB':>9} {'vs bare':>8}")
    fork_rows: Dict[str, Optional[Tuple[Callable, Callable]]] = {
        "ours (fork)": (by_ours(reads_global_and_argument, "fork"), by_ours(reads_argument, "fork")),
        "torch.mp start_processes (fork)": (by_torch_mp(reads_global_and_argument, "fork"),
                                            by_torch_mp(reads_argument, "fork")),
        "accelerate notebook_launcher": None,
    }
    accelerate_loaded, accelerate_bare = by_accelerate(reads_global_and_argument), by_accelerate(reads_argument)
    if accelerate_loaded:
        fork_rows["accelerate notebook_launcher"] = (accelerate_loaded, accelerate_bare)
    for name, pair in fork_rows.items():
        if pair is None:
            print(f"{name:40} (not installed)")
            continue
        loaded, bare = pair
        seconds, uss = measure(loaded, argument, repeats)
        _, bare_uss = measure(bare, small, repeats)
        print(f"{name:40} {seconds:9.3f} {uss:9.1f} {bare_uss:9.1f} {uss / bare_uss:7.2f}x")

    BIG_GLOBAL = None
    del argument
    print("\nB. 800 MiB tensor argument, 2 ranks (first: a new tensor, moved into shared memory once;"
          " again: the same tensor, median)")
    print(f"{'':34} {'bare s':>7} {'first s':>8} {'extra':>6} {'again s':>8} {'extra':>6} {'rank MiB':>9}")
    notebook_launcher(reads_argument, args=(scratch, small), num_processes=2, start_method="forkserver",
                      display="none")  # the fork server is warm from here on
    rows: List[Tuple[str, Callable]] = [
        ("ours (forkserver, warm)", by_ours(reads_argument, "forkserver")),
        ("ours (spawn)", by_ours(reads_argument, "spawn")),
        ("torch.mp start_processes (spawn)", by_torch_mp(reads_argument, "spawn")),
    ]
    for name, launch in rows:
        bare_seconds, _ = measure(launch, small, repeats)
        huge = torch.ones(200 * MIB)        # 800 MiB, new for each launcher
        first, _ = measure(launch, huge, 1)
        again, uss = measure(launch, huge, repeats)
        del huge
        print(f"{name:34} {bare_seconds:7.3f} {first:8.3f} {first - bare_seconds:6.2f} {again:8.3f} "
              f"{again - bare_seconds:6.2f} {uss:9.1f}")
    print("\ngoals: fork rank <= 1.1x a bare rank's memory; warm fork server <= 1 s extra, no 800 MiB copy")


if __name__ == "__main__":
    main()
