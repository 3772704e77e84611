"""Progress bars in ranks: per-iteration cost, and widget traffic a frontend receives for a fast loop.

    python benchmarks/bench_progress.py            # prints two markdown tables

1. Per-iteration cost inside a launched rank (2 ranks, fork, CPU), for an empty loop body — the worst
   case for a bar — best of 7 round-robin runs of 3,000,000 iterations:
   no bar | plain tqdm (tqdm.std's own display, writing to the rank's captured stderr) | ``progress``.
   Goal: ``progress`` ≤ 1.0 × plain tqdm.
2. Messages the frontend receives per bar per second for a fast loop (~3 s, 2 ranks), counted on the
   kernel's IOPub channel with nbclient:
   notebook_accel + ``progress`` | notebook_accel + plain ``tqdm.auto`` | accelerate's
   ``notebook_launcher`` + ``tqdm.auto`` | (reference) ``tqdm.auto`` in the kernel, no launcher.
   Goal: ≤ 10 widget messages per bar per second.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import statistics
import sys
import tempfile
import textwrap
import time
from collections import Counter, defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

ITERATIONS = 3_000_000
REPEATS = 7


# ----------------------------------------------------------------------------------------- 1. cost per iteration

def _rank_costs(iterations: int, repeats: int):
    """Runs inside each rank: ns per iteration for no bar, plain tqdm, progress (best of ``repeats``)."""
    import os
    import time

    import tqdm.std

    from notebook_accel import progress
    from notebook_accel.rank.progress import _STD

    # The rank's tqdm is patched to report; rebuild tqdm's own terminal frontend from its saved methods.
    plain_tqdm = type("plain_tqdm", (tqdm.std.tqdm,), {name: _STD[name] for name in
                      ("__init__", "display", "close", "clear", "moveto", "status_printer")})

    def no_bar():
        for _ in range(iterations):
            pass

    def plain():
        for _ in plain_tqdm(range(iterations), file=sys.stderr):
            pass

    def ours():
        for _ in progress(range(iterations)):
            pass

    import sys
    loops = (("no bar", no_bar), ("plain tqdm", plain), ("progress", ours))
    best = {name: float("inf") for name, _ in loops}
    for _ in range(repeats):  # round-robin, so drift (frequency, the other rank) hits every variant alike
        for name, loop in loops:
            start = time.perf_counter()
            loop()
            best[name] = min(best[name], time.perf_counter() - start)
    return {"rank": int(os.environ["RANK"]), **{name: t / iterations * 1e9 for name, t in best.items()}}


def bench_cost():
    from notebook_accel import notebook_launcher

    per_rank = notebook_launcher(_rank_costs, args=(ITERATIONS, REPEATS), num_processes=2, display="none",
                                 return_all=True)
    rows = {name: statistics.mean(r[name] for r in per_rank) for name in ("no bar", "plain tqdm", "progress")}
    print(f"\n### 1. Per-iteration cost in a rank ({ITERATIONS:,} iterations, empty body, best of {REPEATS}, "
          f"mean of 2 ranks)\n")
    print("| loop | ns / iteration | vs plain tqdm |")
    print("|---|---:|---:|")
    for name, ns in rows.items():
        print(f"| {name} | {ns:.1f} | {ns / rows['plain tqdm']:.2f}× |")
    return rows


# ----------------------------------------------------------------------------------------- 2. frontend traffic

SETUP = f"""
import sys, time
sys.path.insert(0, {REPO!r})
from tqdm.auto import tqdm
from notebook_accel import notebook_launcher, progress

SECONDS = 3.0

def _chunk():
    for i in range(1000):
        x = i * i

def _calibrate():
    start, chunks = time.perf_counter(), 0
    while time.perf_counter() - start < 0.5:
        _chunk()
        chunks += 1
    return chunks / 0.5

# each rank has a core of its own (2 ranks, 2 cores): about the single-process speed
CHUNKS = int(_calibrate() * SECONDS)

def fast_loop(bar, chunks=CHUNKS):
    # a fast loop (~1 µs per iteration) of about SECONDS, updated in chunks of 1000
    with bar(total=chunks * 1000, desc="fast") as b:
        for _ in range(chunks):
            _chunk()
            b.update(1000)
    return chunks * 1000

def with_progress():
    return fast_loop(progress)

def with_tqdm_auto():
    return fast_loop(tqdm)
"""

CELLS = {
    "notebook_accel + progress": "notebook_launcher(with_progress, num_processes=2)",
    "notebook_accel + tqdm.auto": "notebook_launcher(with_tqdm_auto, num_processes=2)",
    "accelerate notebook_launcher + tqdm.auto": (
        "import torch\nfrom accelerate import notebook_launcher as accelerate_launcher\n"
        "accelerate_launcher(with_tqdm_auto, num_processes=2)"),
    "tqdm.auto in the kernel (no launcher, 1 bar)": "with_tqdm_auto()",
}


def bench_traffic():
    import nbformat
    from nbclient import NotebookClient

    class Recording(NotebookClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.messages = defaultdict(list)

        def process_message(self, msg, cell, cell_index):
            self.messages[cell_index].append((time.monotonic(), msg))
            return super().process_message(msg, cell, cell_index)

    names = list(CELLS)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SETUP)] +
                                  [nbformat.v4.new_code_cell(CELLS[name]) for name in names])
    with tempfile.TemporaryDirectory() as tmp:
        client = Recording(nb, timeout=300, kernel_name="python3", allow_errors=True,
                           resources={"metadata": {"path": tmp}})
        # The kernel (and torch elastic's log dirs under accelerate) use the temporary directory, removed after.
        saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "TMPDIR")}
        os.environ["PYTHONPATH"] = REPO + (os.pathsep + saved["PYTHONPATH"] if saved["PYTHONPATH"] else "")
        os.environ["TMPDIR"] = tmp
        try:
            # The kernel's own log (ipykernel dropping the forked ranks' widget messages under accelerate's
            # launcher, one warning per message) would bury the tables: keep it off the terminal.
            client.execute(stderr=subprocess.DEVNULL)
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)

    print("\n### 2. What the frontend receives for a fast loop (~3 s, 2 ranks)\n")
    print("| launch | progress bars shown | msgs / bar / s (the bar's own widgets) | all comm msgs / s "
          "| stream msgs / s | final value == total |")
    print("|---|---:|---:|---:|---:|---|")
    results = {}
    for index, name in enumerate(names, start=1):
        messages = client.messages[index]
        timed = [t for t, msg in messages if msg["msg_type"] not in ("status", "execute_input")]
        seconds = (max(timed) - min(timed)) if len(timed) > 1 else 0.0
        kinds = Counter(msg["msg_type"] for _, msg in messages)
        state, updates = {}, Counter()
        for _, msg in messages:
            content = msg["content"]
            if msg["msg_type"] == "comm_open":
                state[content["comm_id"]] = dict(content.get("data", {}).get("state", {}))
            elif msg["msg_type"] == "comm_msg":
                updates[content["comm_id"]] += 1
                state.setdefault(content["comm_id"], {}).update(content["data"].get("state", {}))
        bars = [comm for comm, s in state.items() if s.get("_model_name") in ("FloatProgressModel", "IntProgressModel")]
        per_bar = []
        for bar in bars:  # the bar and its siblings (desc / n-total-rate texts) in the same HBox
            siblings = {bar}
            for s in state.values():
                children = [c.replace("IPY_MODEL_", "") for c in s.get("children", [])]
                if bar in children:
                    siblings.update(children)
            per_bar.append(sum(updates[c] for c in siblings) / seconds if seconds else 0.0)
        finals = [state[b].get("value") == state[b].get("max") for b in bars]
        errors = [msg["content"].get("ename") for _, msg in messages if msg["msg_type"] == "error"]
        final_text = ("yes" if finals and all(finals) else "no" if finals else "—") + (
            f" (error: {errors[0]})" if errors else "")
        mean_per_bar = f"{statistics.mean(per_bar):.1f} (max {max(per_bar):.1f})" if per_bar else "0"
        all_comm = f"{kinds.get('comm_msg', 0) / seconds:.1f}" if seconds else "0"
        stream = f"{kinds.get('stream', 0) / seconds:.1f}" if seconds else f"{kinds.get('stream', 0)} in total"
        print(f"| {name} | {len(bars)} | {mean_per_bar} | {all_comm} | {stream} | {final_text} |")
        if os.environ.get("BENCH_DEBUG"):
            print("   ", round(seconds, 2), dict(kinds))
        results[name] = {"bars": len(bars), "per_bar_per_s": per_bar, "seconds": seconds, "kinds": dict(kinds)}
    print("\nmsgs / bar / s: comm messages to a bar's own widgets (the progress widget and its text siblings), "
          "divided by the cell's duration. Under accelerate's launcher the forked ranks' tqdm.notebook bars "
          "never reach the frontend: ipykernel drops messages sent from a forked child (its log says "
          "'attempted to send message from fork'), so the cell shows no progress at all.")
    return results


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    bench_cost()
    bench_traffic()
