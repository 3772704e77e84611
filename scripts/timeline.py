"""Where a parallel ``pytest`` run's wall time went: each worker's files in the order it ran them, how long each took,
and when each worker went idle — the worker that ends last sets the run's time, whatever ``--durations`` shows.

Usage: ``NOTEBOOK_ACCEL_TIMELINE=/tmp/t.tsv pytest -q``, then ``python scripts/timeline.py /tmp/t.tsv [N]`` (the N
slowest files, 15 by default). tests/conftest.py writes the lines (worker, start, end, test id, CPU seconds of the
worker's process tree during the test).
``python scripts/timeline.py /tmp/t.tsv --costs > tests/file_seconds.json`` writes each file's seconds for the
suite's scheduler (tests/suite_schedule.py), from a run on a quiet machine.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Dict, List, Tuple


def read(path: str) -> List[Tuple[str, float, float, str]]:
    rows = []
    with open(path) as lines:
        for line in lines:
            worker, start, end, nodeid = line.rstrip("\n").split("\t")[:4]
            rows.append((worker, float(start), float(end), nodeid))
    return rows


def cpu_seconds(path: str) -> Dict[str, float]:
    """Each file's CPU seconds (its tests' process trees, the fifth column where the run wrote one)."""
    seconds: Dict[str, float] = defaultdict(float)
    with open(path) as lines:
        rows = [line.rstrip("\n").split("\t") for line in lines]
    parallel = any(fields[0] != "main" for fields in rows)
    for fields in rows:
        if len(fields) > 4 and not (parallel and fields[0] == "main"):
            seconds[fields[3].split("::")[0]] += float(fields[4])
    return dict(seconds)


def workers_rows(path: str) -> List[Tuple[str, float, float, str]]:
    rows = read(path)
    if any(worker != "main" for worker, *_ in rows):   # under xdist the controller logs every test again
        rows = [row for row in rows if row[0] != "main"]
    return rows


def costs(path: str) -> Dict[str, float]:
    """Each file's seconds: the sum of its tests' (setup to teardown), rounded up to a tenth."""
    seconds: Dict[str, float] = defaultdict(float)
    for _, start, end, nodeid in workers_rows(path):
        seconds[nodeid.split("::")[0]] += end - start
    return {name: round(value + 0.05, 1) for name, value in sorted(seconds.items())}


def main(path: str, slowest: int = 15) -> None:
    rows = workers_rows(path)
    began = min(start for _, start, _, _ in rows)
    files: Dict[Tuple[str, str], List[float]] = {}
    for worker, start, end, nodeid in rows:
        span = files.setdefault((worker, nodeid.split("::")[0]), [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    by_worker: Dict[str, List[Tuple[float, float, str]]] = defaultdict(list)
    for (worker, name), (start, end) in files.items():
        by_worker[worker].append((start, end, name))
    print("worker  busy(s)  ends at(s)  files")
    for worker, spans in sorted(by_worker.items()):
        busy = sum(end - start for start, end, _ in spans)
        print(f"{worker:7} {busy:8.1f} {max(end for _, end, _ in spans) - began:10.1f}  {len(spans)}")
    print(f"\nthe {slowest} slowest files (worker, seconds from its first test's start to its last's end):")
    for (worker, name), (start, end) in sorted(files.items(), key=lambda item: item[1][0] - item[1][1])[:slowest]:
        print(f"{end - start:7.1f}  {worker:5}  {name}")
    cpu = cpu_seconds(path)
    if cpu:
        print(f"\nCPU seconds (process trees), {sum(cpu.values()):.0f} in all; the {slowest} dearest files:")
        for name, used in sorted(cpu.items(), key=lambda item: -item[1])[:slowest]:
            print(f"{used:7.1f}  {name}")


if __name__ == "__main__":
    if sys.argv[2:] == ["--costs"]:
        print(json.dumps(costs(sys.argv[1]), indent=1))
    else:
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15)
