"""2 nodes × 2 ranks on localhost: time from the launcher call to every rank running, and time to recover
from one failed attempt — notebook_accel vs accelerate's ``notebook_launcher(num_nodes=2)`` vs ``torchrun``.

    GLOO_SOCKET_IFNAME=lo python benchmarks/bench_nodes.py --repeats 3

Each node is its own Python process with torch already imported; both call their launcher at the same
wall-clock moment (``go``). Every rank writes the time it entered the function and the time its first
all-reduce over both nodes returned. ``torchrun``'s figure starts at its command (it is one), so it
includes torchrun's own interpreter start. Recovery: rank 3 fails in attempt 0 right after its first
all-reduce; recovery is from that failure to every rank of attempt 1 having finished its all-reduce.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
TOOLS = ("notebook_accel", "accelerate", "torchrun")


def rank_job(folder: str, fail: bool) -> int:
    """What every rank runs (all three tools): stamp the entry, all-reduce over both nodes, stamp again."""
    entered = time.time()
    import torch
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    open(os.path.join(folder, f"entered-{attempt}-{rank}"), "w").close()  # "this attempt's rank started"
    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    ready = time.time()
    with open(os.path.join(folder, f"rank-{attempt}-{rank}"), "w") as handle:
        handle.write(f"{entered} {ready}")
    if fail and attempt == 0 and rank == 3:
        with open(os.path.join(folder, "failed"), "w") as handle:
            handle.write(str(time.time()))
        raise RuntimeError("rank 3 fails in attempt 0")
    dist.barrier()
    dist.destroy_process_group()
    return rank


def node_main(tool: str, node: int, port: int, folder: str, go: float, fail: bool) -> None:
    """One node: import everything first, wait for ``go``, then call the launcher."""
    import torch.distributed  # noqa: F401 - warm, as a notebook kernel that already imported torch

    restarts = 1 if fail else 0
    if tool == "notebook_accel":
        sys.path.insert(0, REPO)
        from notebook_accel import notebook_launcher
    else:
        from accelerate import notebook_launcher as accelerate_launcher  # noqa: F401
    time.sleep(max(0.0, go - time.time()))
    try:
        if tool == "notebook_accel":
            notebook_launcher(rank_job, args=(folder, fail), num_processes=2, num_nodes=2, node_rank=node,
                              rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=restarts, display="none")
        else:
            accelerate_launcher(rank_job, args=(folder, fail), num_processes=2, num_nodes=2, node_rank=node,
                                master_addr="127.0.0.1", use_port=str(port), max_restarts=restarts)
    except BaseException as error:  # recorded, not raised: the table says which tool failed
        print(f"node {node} failed: {type(error).__name__}: {str(error)[:300]}", file=sys.stderr)


def run_once(tool: str, fail: bool, timeout: float = 90):
    """Both nodes of one launch; returns (start seconds, ready seconds, recovery seconds or None)."""
    port = _free_port()
    folder = tempfile.mkdtemp(prefix="bench_nodes-")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    go = time.time() + (1.0 if tool == "torchrun" else 6.0)
    processes = []
    for node in (0, 1):
        if tool == "torchrun":
            time.sleep(max(0.0, go - time.time()))
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                       "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                       "--max-restarts", "1" if fail else "0", HERE, "--rank", folder] + (["--fail"] if fail else [])
        else:
            command = [sys.executable, HERE, "--node", tool, str(node), str(port), folder, repr(go)] + (
                ["--fail"] if fail else [])
        # stderr to a file, not a pipe: a hung rank that outlives its launcher must not keep us reading.
        log = open(os.path.join(folder, f"node{node}.err"), "w")
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                          start_new_session=True))
        log.close()
    end = time.monotonic() + timeout
    hung = False
    for process in processes:
        try:
            process.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
    if hung:
        _kill_everything_in(folder)
        for process in processes:
            process.wait()
    try:
        return _read_stamps(folder, go, fail, hung, timeout)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_stamps(folder: str, go: float, fail: bool, hung: bool, timeout: float):
    errors = []
    for node in (0, 1):
        with open(os.path.join(folder, f"node{node}.err")) as handle:
            errors.append(handle.read() + (f"\nhung: killed after {timeout:g} s" if hung else ""))
    stamps = {}
    for path in glob.glob(os.path.join(folder, "rank-*")):
        _, attempt, rank = os.path.basename(path).split("-")
        with open(path) as handle:
            stamps[(int(attempt), int(rank))] = [float(value) for value in handle.read().split()]
    failed_at = None
    if os.path.exists(os.path.join(folder, "failed")):
        with open(os.path.join(folder, "failed")) as handle:
            failed_at = float(handle.read())
    first = [stamps.get((0, rank)) for rank in range(4)]
    if None in first:
        return None, None, None, _last_error(errors)
    start = max(entered for entered, _ in first) - go
    ready = max(done for _, done in first) - go
    recovery = None
    if fail:
        second = [stamps.get((1, rank)) for rank in range(4)]
        if None in second or failed_at is None:
            restarted = len(glob.glob(os.path.join(folder, "entered-1-*")))
            if restarted:
                return start, ready, None, (f"attempt 1: {restarted}/4 ranks restarted, their first all-reduce "
                                            f"never returned; " + _last_error(errors))
            return start, ready, None, "attempt 1 never started; " + _last_error(errors)
        recovery = max(done for _, done in second) - failed_at
    return start, ready, recovery, ""


def _last_error(errors) -> str:
    for text in errors:
        if "hung: killed" in text:
            return text.strip().splitlines()[-1]
    for text in errors:
        lines = [line for line in text.splitlines() if "Error" in line or "error" in line or "failed" in line]
        if lines:
            return lines[-1][:160]
    return "no rank stamps"


def _kill_everything_in(folder: str) -> None:
    """Kill the processes this launch started: every command line names its unique temp folder (torchrun's
    workers run in sessions of their own, so a process group kill would miss them)."""
    import psutil

    for process in psutil.process_iter(["pid", "cmdline"]):
        if folder in " ".join(process.info["cmdline"] or []):
            try:
                process.kill()
            except psutil.Error:
                pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    options = parser.parse_args()
    rows = []
    for tool in options.tools:
        starts, readies, notes = [], [], set()
        for _ in range(options.repeats):
            start, ready, _, note = run_once(tool, fail=False)
            if start is None:
                notes.add(note)
            else:
                starts.append(start)
                readies.append(ready)
        _, _, recovery, note = run_once(tool, fail=True)
        rows.append((tool, starts, readies, recovery, note or "; ".join(notes)))
    print(f"{'tool':<16}{'to all ranks running':>22}{'to first all-reduce':>22}{'recovery (1 restart)':>22}  note")
    for tool, starts, readies, recovery, note in rows:
        start = f"{statistics.median(starts):.2f} s" if starts else "failed"
        ready = f"{statistics.median(readies):.2f} s" if readies else "failed"
        recovered = f"{recovery:.2f} s" if recovery is not None else "failed"
        print(f"{tool:<16}{start:>22}{ready:>22}{recovered:>22}  {note}")
    print(f"(median of {options.repeats} launches; 2 nodes x 2 CPU ranks on localhost; {os.cpu_count()} cores)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--node":
        tool, node, port, folder, go = sys.argv[2:7]
        node_main(tool, int(node), int(port), folder, float(go), "--fail" in sys.argv)
    elif len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_job(sys.argv[2], "--fail" in sys.argv)
    else:
        main()
