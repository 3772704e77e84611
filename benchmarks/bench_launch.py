"""Launch overhead and output throughput, ours vs the anchors, side by side in one run.

    python benchmarks/bench_launch.py [--repeats 10] [--lines 50000]

Rows: the median wall time of launching a trivial function on 2 CPU ranks (and returning), and the time
to deliver 2 × N printed lines to the kernel, and the launch overhead as CPU ranks outnumber the cores
(N = 2, 4, 8, 16). Ratios are against accelerate's ``notebook_launcher`` where it is installed. Goals:
ours ≤ 0.4× accelerate's median trivial launch; warm forkserver ≤ 0.3 s (issue 2); every line labelled
(``display='text'``) ≤ 1.0× accelerate's unlabelled output (issue 16).
"""
from __future__ import annotations

import argparse
import contextlib
import io
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

from notebook_accel import notebook_launcher  # noqa: E402


def trivial():
    return 1


def print_lines(count):
    for index in range(count):
        print(f"line {index} of rank {os.environ.get('RANK')}")


@contextlib.contextmanager
def fds_to_devnull():
    """Send fd 1/2 (and sys.stdout/err) to /dev/null: the anchors' ranks write straight to the terminal."""
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(devnull, 1), os.dup2(devnull, 2)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        for fd in saved + [devnull]:
            os.close(fd)


def timed(call: Callable[[], object], repeats: int, warmup: int = 0) -> List[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def ours(method: str, function=trivial, args=(), display="none", ranks: int = 2):
    def call():
        with fds_to_devnull():  # more ranks than cores: one line says they share the cores
            notebook_launcher(function, args=args, num_processes=ranks, start_method=method, display=display)
    return call


def accelerate_launcher(function=trivial, args=(), ranks: int = 2) -> Optional[Callable[[], object]]:
    try:
        from accelerate import notebook_launcher as accelerate_notebook_launcher
    except ImportError:
        return None

    def call():
        with fds_to_devnull():  # it prints "Launching training on ..." each time
            accelerate_notebook_launcher(function, args=args, num_processes=ranks)
    return call


def torch_start_processes(function=trivial, args=(), ranks: int = 2):
    from torch.multiprocessing import start_processes

    def rank(index, *rank_args):
        function(*rank_args)
    return lambda: start_processes(rank, args=args, nprocs=ranks, start_method="fork")


def main() -> None:
    # accelerate's launcher (torch elastic) leaves torchelastic_* dirs in the temp dir: keep them in ours.
    scratch = tempfile.mkdtemp(prefix="bench_launch-")
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    # Removed at exit, after multiprocessing removed the fork server's dir inside it (priority -100 first).
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True},
                                  exitpriority=-101)
    run_benchmarks()


def run_benchmarks() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--scaling", type=int, nargs="*", default=[2, 4, 8, 16],
                        help="CPU rank counts for the scaling table (more than the cores here is allowed)")
    options = parser.parse_args()

    rows: Dict[str, Optional[List[float]]] = {}
    rows["ours, fork"] = timed(ours("fork"), options.repeats, warmup=1)
    forkserver_first = timed(ours("forkserver"), 1)
    rows["ours, forkserver (first launch)"] = forkserver_first
    rows["ours, forkserver (warm)"] = timed(ours("forkserver"), options.repeats)
    rows["ours, spawn"] = timed(ours("spawn"), max(3, options.repeats // 2))
    anchor = accelerate_launcher()
    rows["accelerate notebook_launcher"] = timed(anchor, options.repeats, warmup=1) if anchor else None
    rows["torch.multiprocessing.start_processes (fork)"] = timed(torch_start_processes(), options.repeats, warmup=1)

    lines = options.lines
    print_rows: Dict[str, Optional[List[float]]] = {}
    with fds_to_devnull():
        print_rows[f"ours, fork, display='text' (2 x {lines} lines)"] = timed(
            ours("fork", print_lines, (lines,), display="text"), 3)
        print_rows[f"ours, fork, display='none' (2 x {lines} lines)"] = timed(
            ours("fork", print_lines, (lines,)), 3)
    anchor_lines = accelerate_launcher(print_lines, (lines,))
    print_rows[f"accelerate notebook_launcher (2 x {lines} lines)"] = timed(anchor_lines, 3) if anchor_lines else None
    with fds_to_devnull():
        print_rows[f"torch start_processes (2 x {lines} lines)"] = timed(torch_start_processes(print_lines, (lines,)), 3)

    def table(title: str, data: Dict[str, Optional[List[float]]], reference: str) -> None:
        base = statistics.median(data[reference]) if data.get(reference) else None
        print(f"\n{title}")
        print(f"{'':52} {'median s':>9} {'min s':>8} {'vs accelerate':>14}")
        for name, times in data.items():
            if times is None:
                print(f"{name:52} {'(not installed)':>9}")
                continue
            median = statistics.median(times)
            ratio = f"{median / base:.2f}x" if base else "-"
            print(f"{name:52} {median:9.3f} {min(times):8.3f} {ratio:>14}")

    scaling = {}
    for ranks in options.scaling:  # launch overhead as the CPU ranks outnumber the cores
        repeats = max(3, options.repeats // 2)
        scaling[f"ours, fork, {ranks} ranks"] = timed(ours("fork", ranks=ranks), repeats, warmup=1)
        anchor_n = accelerate_launcher(ranks=ranks)
        scaling[f"accelerate notebook_launcher, {ranks} ranks"] = (
            timed(anchor_n, repeats, warmup=1) if anchor_n else None)
        scaling[f"torch start_processes (fork), {ranks} ranks"] = timed(
            torch_start_processes(ranks=ranks), repeats, warmup=1)

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, python {sys.version.split()[0]}")
    table("Trivial launch, 2 CPU ranks", rows, "accelerate notebook_launcher")
    table("Delivering printed lines", print_rows, f"accelerate notebook_launcher (2 x {lines} lines)")
    print(f"\nScaling: trivial launch with N CPU ranks on {os.cpu_count()} cores (median s; ratio to accelerate's "
          f"with the same N)")
    print(f"{'N':>4} {'ours (fork)':>12} {'accelerate':>12} {'torch.mp':>10} {'ours/acc':>9} {'ours per rank':>14}")
    for ranks in options.scaling:
        ours_s = statistics.median(scaling[f"ours, fork, {ranks} ranks"])
        acc = scaling[f"accelerate notebook_launcher, {ranks} ranks"]
        acc_s = statistics.median(acc) if acc else None
        tmp_s = statistics.median(scaling[f"torch start_processes (fork), {ranks} ranks"])
        ratio = f"{ours_s / acc_s:.2f}x" if acc_s else "-"
        acc_text = f"{acc_s:12.3f}" if acc_s else f"{'-':>12}"
        print(f"{ranks:>4} {ours_s:12.3f} {acc_text} {tmp_s:10.3f} {ratio:>9} {1000 * ours_s / ranks:11.1f} ms")
    if rows.get("accelerate notebook_launcher"):
        ratio = statistics.median(rows["ours, fork"]) / statistics.median(rows["accelerate notebook_launcher"])
        print(f"\ngoal: ours (fork) <= 0.4x accelerate: {ratio:.2f}x -> {'met' if ratio <= 0.4 else 'NOT met'}")
    labelled = print_rows[f"ours, fork, display='text' (2 x {lines} lines)"]
    unlabelled = print_rows[f"accelerate notebook_launcher (2 x {lines} lines)"]
    if unlabelled:
        ratio = statistics.median(labelled) / statistics.median(unlabelled)
        print(f"goal: labelled output <= 1.0x accelerate's: {ratio:.2f}x -> {'met' if ratio <= 1.0 else 'NOT met'}")
    warm = statistics.median(rows["ours, forkserver (warm)"])
    print(f"goal: warm forkserver launch <= 0.3 s: {warm:.3f} s -> {'met' if warm <= 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
