"""What crosses ``srun``'s stdio for a warm run, write by write (issue 45's latency point; no cluster needed).

Slurm carries stdio between ``srun`` and each node in messages of at most 1 KiB over TCP with Nagle's algorithm on: a
message sent while the previous one is unacknowledged waits for the receiver's delayed ACK, 40 ms. A warm
``Session.run`` on Slurm took 44–48 ms (88–92 ms under load) for that alone: the kernel wrote one command per rank,
and a rank sent its result and its task's end apart. Here, each of the writes that keep it at a few milliseconds:

- the run's command for every rank in one write (``RelayedWarmRanks.send_to_every_rank`` on a ``StreamRelay``), and
  ``SessionRunBackend`` sending it that way;
- a small function's command within one srun message (``wire.text_frames``: the pickle zlib-compressed);
- a rank's result with its task's end in one write (``EventQueue.take``'s linger, ``SlurmTask._pump``), and a
  launch's last events with its exit code.
"""
from __future__ import annotations

import os
import threading
import time
import types
from typing import Any, List

from notebook_accel.backends.relay import RelayedWarmRanks, StreamRelay
from notebook_accel.backends.session import SessionRunBackend
from notebook_accel.backends.slurm.session import SessionSlurmStep
from notebook_accel.plan.plan import LaunchPlan
from notebook_accel.plan.sites import SlurmAllocation
from notebook_accel.rank import slurm_task
from notebook_accel.rank.actor import EventQueue
from notebook_accel.wire.commands import RunFunction
from notebook_accel.wire.events import RankResult, TaskDone
from notebook_accel.wire.text_frames import EVERY_RANK, SRUN_MESSAGE, LineDecoder, encode

# The benchmark's warm run (benchmarks/bench_cluster.py), as a notebook cell defines it: its module is not importable,
# so the function travels by value, as a notebook's does.
CELL = '''
def slurm_all_reduce_noop():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
'''


def cell_function() -> Any:
    namespace = {"__name__": "notebook_cell"}
    exec(compile(CELL, "<cell>", "exec"), namespace)
    return namespace["slurm_all_reduce_noop"]


def run_command() -> RunFunction:
    command, _, _ = SessionSlurmStep.function_task(cell_function(), (), {}, False)
    command.task_id = 12
    return command


def decoded(lines: List[str]) -> List[Any]:
    decoder = LineDecoder()
    return [message for message in map(decoder.feed, lines) if message is not None]


def test_a_small_functions_run_command_fits_one_srun_message():
    lines = encode(EVERY_RANK, run_command(), message_id=7)
    size = sum(len(line) for line in lines)
    assert size <= SRUN_MESSAGE, f"{size} bytes: srun sends it in two messages, the second 40 ms later"
    [(rank, command)] = decoded(lines)
    assert rank == EVERY_RANK and isinstance(command, RunFunction) and command.task_id == 12


def test_frames_round_trip_compressed_or_not():
    incompressible = os.urandom(3000)
    for message in (("events", ["line " * 400]), ("blob", incompressible), ("hello", {"node": "n1"})):
        assert decoded(encode(3, message, message_id=1)) == [(3, message)]
    assert encode(3, ("events", ["line " * 400]), 1)[0].startswith("@nz ")
    assert encode(3, ("blob", incompressible), 1)[0].startswith("@na ")


def test_a_runs_command_is_one_write_for_every_rank(tmp_path):
    # The launcher's stdin, recorded: a stand-in for srun that writes what it reads to a file.
    recorded = tmp_path / "stdin"
    relay = StreamRelay(["sh", "-c", f"cat > {recorded}"], world_size=2)
    ranks = types.SimpleNamespace(backend=types.SimpleNamespace(world=relay))
    try:
        RelayedWarmRanks.send_to_every_rank(ranks, run_command())   # type: ignore[arg-type]
    finally:
        relay.close()
    messages = decoded(recorded.read_text().splitlines(keepends=True))
    assert [rank for rank, _ in messages] == [EVERY_RANK], "one message per rank: each node's second waits 40 ms"


def test_a_session_run_sends_its_command_to_every_rank_at_once():
    sent: List[Any] = []
    ranks = types.SimpleNamespace(
        handles=[types.SimpleNamespace(rank=0), types.SimpleNamespace(rank=1)],
        started_event=lambda rank: ("started", rank),
        send=lambda rank, command, fds=None: sent.append(("one rank", rank)),
        send_to_every_rank=lambda command, fds=None: sent.append(("every rank", command.task_id)))
    plan = LaunchPlan("f", None, 2, "cpu", SlurmAllocation(2, 1, "7"), "no", None, False, "none")
    backend = SessionRunBackend(plan, ranks=ranks, task_id=12, command=run_command(), fds=[],  # type: ignore[arg-type]
                                recover_timeout=1.0, after=lambda ended, deliver: None)
    delivered: List[Any] = []
    backend._start({}, types.SimpleNamespace(deliver=delivered.append, asker=types.SimpleNamespace(absent=None)))
    assert sent == [("every rank", 12)]
    assert delivered == [("started", 0), ("started", 1)]


def test_a_result_waits_for_its_tasks_end_and_no_longer():
    queue = EventQueue()
    queue.put(RankResult(rank=0, payload=b""))
    later = threading.Timer(0.02, queue.put, (TaskDone(rank=0, task_id=3),))
    later.start()
    began = time.monotonic()
    events, last = queue.take(0.2, linger=30.0)
    later.join()
    assert [type(event) for event in events] == [RankResult, TaskDone] and not last
    assert time.monotonic() - began < 20.0, "it waited out the linger: the TaskDone did not end the wait"
    queue.put(RankResult(rank=0, payload=b""))
    began = time.monotonic()
    events, _ = queue.take(0.2, linger=0.05)     # no end comes: sent after the linger
    assert [type(event) for event in events] == [RankResult] and time.monotonic() - began < 20.0
    assert queue.take(0.0) == ([], False)


class RecordingWriter:
    def __init__(self) -> None:
        self.writes: List[List[Any]] = []

    def send(self, message: Any, rank: Any = None) -> None:
        self.send_many([message], rank)

    def send_many(self, messages: Any, rank: Any = None) -> None:
        self.writes.append(list(messages))


def test_a_slurm_task_writes_a_result_with_its_tasks_end():
    queue = EventQueue()
    task = types.SimpleNamespace(actor=types.SimpleNamespace(poll=queue.take), writer=RecordingWriter(), _last=None)
    pump = threading.Thread(target=slurm_task.SlurmTask._pump, args=(task,))
    pump.start()
    queue.put(RankResult(rank=0, payload=b""))
    time.sleep(0.005)   # the rank's output synced, its memory sampled: a moment between the result and the end
    queue.put(TaskDone(rank=0, task_id=3))
    time.sleep(0.3)
    queue.end()
    pump.join(10.0)
    assert [[type(event) for event in message[1]] for [message] in task.writer.writes] == [[RankResult, TaskDone]]
    assert task._last == []   # the last batch is left for serve(), to go with the exit code
