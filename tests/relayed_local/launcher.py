"""The tests' relayed backend's launcher (``relayed_local``), run as a script: ``python launcher.py WORLD_SIZE``.

It does for local processes what ``srun`` does for a Slurm step's tasks: starts one task per rank
(``python -m notebook_accel.rank.slurm_task``, the task side of ``relay.stream.StreamRelay``'s conversation), gives
each its place in the variables the task reads, forwards its own stdin to every task, lets them share its stdout (their
frame lines, each written whole), and says on its stderr, in its own words, when a task ended:
``relayed-local: rank 1 ended with exit code 137``. Only the standard library: it starts before any rank.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import List

NAME = "relayed-local"
NODE = "relay-node"   # the one node its ranks are on, as messages name it


def task_env(rank: int, world_size: int) -> dict:
    """The task's place, in the variables ``rank.slurm_task`` reads it from (as a Slurm task finds them)."""
    return {**os.environ, "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world_size), "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0", "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "local", "SLURM_STEP_ID": "0"}


def forward(tasks: List[subprocess.Popen]) -> None:
    """Every line of our stdin to every task; at its end, the end of theirs."""
    for line in sys.stdin.buffer:
        for task in tasks:
            try:
                task.stdin.write(line)
                task.stdin.flush()
            except (OSError, ValueError):   # that task is gone
                pass
    for task in tasks:
        try:
            task.stdin.close()
        except OSError:
            pass


def main(world_size: int) -> int:
    tasks = [subprocess.Popen([sys.executable, "-u", "-m", "notebook_accel.rank.slurm_task"], stdin=subprocess.PIPE,
                              env=task_env(rank, world_size)) for rank in range(world_size)]
    threading.Thread(target=forward, args=(tasks,), daemon=True).start()
    lock = threading.Lock()

    def watch(rank: int, task: subprocess.Popen) -> None:   # each task's end, said as soon as it ended
        code = task.wait()
        with lock:
            print(f"{NAME}: rank {rank} ended with exit code {code}", file=sys.stderr, flush=True)

    watchers = [threading.Thread(target=watch, args=(rank, task)) for rank, task in enumerate(tasks)]
    for watcher in watchers:
        watcher.start()
    for watcher in watchers:
        watcher.join()
    return max((task.returncode for task in tasks), key=abs)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
