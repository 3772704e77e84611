"""The debugging dashboard's costs: resource sampling per rank, and the frontend traffic of a busy launch.

    python benchmarks/bench_dashboard.py                 # 15 s of real sampling, a simulated 60 s launch
    python benchmarks/bench_dashboard.py --seconds 60    # the issue's full length for the sampling part

1. Resource sampling (``ResourceSampler``, in the kernel): N real rank-like processes, each with one child
   (a DataLoader worker stand-in), sampled once a second for ``--seconds``. Reported: the kernel's CPU time
   spent sampling, per rank and per second of launch, and the widget messages per second the samples cause
   in a ``WidgetView`` (rank labels and the header). No NVML here (no GPU): GPU reads are not in the figure.
2. Frontend traffic of 8 ranks × 3 bars × 4 metrics for 60 s: the real ``WidgetView`` fed, against a
   simulated clock, what such a launch sends (each bar at tqdm's 10 states a second, ``report`` of 4 metrics
   at its 50-a-second cap per rank, a resource sample per rank per second, a rank that stalls for 20 s).
   Every widget message is counted (``Widget.send_state``), split into the bars' and everything else's.
   Goal: ≤ 10 messages a second in total on top of the bars, whatever the number of ranks.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CHILD = "import time, sys; b = bytearray(50 * 2 ** 20); time.sleep(3600)"
RANK = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', %r]); "
        "b = bytearray(100 * 2 ** 20); time.sleep(3600)" % CHILD)


def bench_sampling(ranks: int, seconds: float) -> dict:
    import ipywidgets

    from notebook_accel.wire.events import LaunchStarted, RankStarted
    from notebook_accel.monitor.resources import ResourceSampler
    from notebook_accel.views.widgets import WidgetView

    processes = [subprocess.Popen([sys.executable, "-c", RANK], start_new_session=True) for _ in range(ranks)]
    sent = Counter()
    original = ipywidgets.Widget.send_state

    def count(self, key=None):
        sent[type(self).__name__] += 1
        return original(self, key)

    try:
        time.sleep(2.0)  # let every process start its child
        view = WidgetView(display=False)
        view.handle(LaunchStarted(rank=-1, world_size=ranks, device="cpu", start_method="fork"))
        sampler = ResourceSampler(view.handle, device="cpu")
        for rank, process in enumerate(processes):
            event = RankStarted(rank=rank, pid=process.pid)
            sampler.observe(event)
            view.handle(event)
        ipywidgets.Widget.send_state = count
        cpu = 0.0
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # the supervisor's loop: a tick every 0.1 s
            before = time.thread_time()
            sampler.tick()
            cpu += time.thread_time() - before
            view.tick()
            time.sleep(0.1)
    finally:
        ipywidgets.Widget.send_state = original
        for process in processes:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait()
    return {"ranks": ranks, "samples": sampler.samples, "cpu_ms_per_rank_per_s": 1000 * cpu / seconds / ranks,
            "messages_per_s": sum(sent.values()) / seconds}


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bench_traffic(ranks: int = 8, bars: int = 3, metrics: int = 4, seconds: int = 60) -> dict:
    import ipywidgets

    import notebook_accel.views.model as model
    import notebook_accel.views.widgets as widgets_module
    from notebook_accel.wire.events import (LaunchFinished, LaunchStarted, MetricReport, ProgressUpdate, RankStarted,
                                            ResourceSample)
    from notebook_accel.views.widgets import WidgetView

    clock = _Clock()
    saved = (model.time.monotonic, widgets_module.time.monotonic)
    model.time.monotonic = widgets_module.time.monotonic = clock  # the same ``time`` module: patched once
    view = WidgetView(display=False)
    bar_widgets = set()
    counts = Counter()
    original = ipywidgets.Widget.send_state

    def count(self, key=None):
        counts["bars" if id(self) in bar_widgets else "other"] += 1
        return original(self, key)

    try:
        view.handle(LaunchStarted(rank=-1, world_size=ranks, device="cuda", start_method="fork"))
        for rank in range(ranks):
            view.handle(RankStarted(rank=rank, pid=10_000 + rank))
        ipywidgets.Widget.send_state = count
        steps_per_tick = 5  # 50 report calls a second per rank, at 10 ticks a second
        for tick in range(seconds * 10):
            clock.now += 0.1
            t = tick / 10
            for rank in range(ranks):
                stalled = rank == ranks - 1 and 20 <= t < 40
                if not stalled:
                    for bar in range(bars):  # epoch (slow), step, and an inner data bar
                        total = (3, 1000, 100)[bar]
                        n = (int(t / 20), tick % 1000, tick % 100)[bar]
                        view.handle(ProgressUpdate(rank=rank, bar_id=bar + 1, desc=("epoch", "step", "data")[bar],
                                                   n=n, total=total, elapsed=t, rate=10.0, position=bar))
                    for _ in range(steps_per_tick):
                        view.handle(MetricReport(rank=rank, step=tick, metrics={f"metric{i}": 1.0 / (1 + tick) * (i + 1)
                                                                               for i in range(metrics)}))
                if tick % 10 == 0:
                    view.handle(ResourceSample(rank=rank, rss=2 ** 30 + tick, peak_rss=2 ** 30 + tick,
                                               cpu_percent=100.0, device_used=2 ** 33, device_total=2 ** 36,
                                               device_peak=2 ** 33, device_util=90.0))
            for row in view._rank_rows.values():
                for slot in row.slots:
                    bar_widgets.update((id(slot.bar), id(slot.text)))
            view.tick()
        view.handle(LaunchFinished(rank=-1, status="finished", elapsed=float(seconds)))
    finally:
        ipywidgets.Widget.send_state = original
        model.time.monotonic, widgets_module.time.monotonic = saved
    return {"bars_per_s": counts["bars"] / seconds, "other_per_s": counts["other"] / seconds,
            "bars_per_bar_per_s": counts["bars"] / seconds / (ranks * bars)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the real sampling run")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    options = parser.parse_args()
    print(f"## 1. Resource sampling ({options.seconds:g} s, real processes, one child each, no GPU)\n")
    print("| ranks | samples | kernel CPU per rank (ms/s) | widget messages/s |")
    print("|---|---|---|---|")
    for ranks in options.ranks:
        row = bench_sampling(ranks, options.seconds)
        print(f"| {row['ranks']} | {row['samples']} | {row['cpu_ms_per_rank_per_s']:.2f} | "
              f"{row['messages_per_s']:.1f} |")
    print("\n## 2. Frontend traffic, 8 ranks × 3 bars × 4 metrics, 60 s (simulated clock, real WidgetView)\n")
    row = bench_traffic()
    print("| bar messages/s (per bar) | other messages/s (goal ≤ 10) |")
    print("|---|---|")
    print(f"| {row['bars_per_s']:.1f} ({row['bars_per_bar_per_s']:.2f}) | {row['other_per_s']:.1f} |")


if __name__ == "__main__":
    main()
