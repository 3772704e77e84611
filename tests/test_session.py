"""Warm ranks (``Session``): real rank processes, a real gloo process group, kept across runs.

Each test starts its own session and closes it; the autouse fixture in conftest.py fails any test that leaves a
rank behind. Bounds on time are generous (they catch a hang, not a slow machine).
"""
from __future__ import annotations

import gc
import os
import signal
import textwrap
import threading
import time

import psutil
import pytest
import torch

from notebook_accel import LaunchTimeout, Session
from notebook_accel.errors import LaunchConfigError, LaunchError
from scripts import run_script
from waiting import wait_until

pytestmark = pytest.mark.timeout(180)

START_METHODS = ["fork", "forkserver", "spawn"]


# ------------------------------------------------------------------------------- functions the tests run

def notebook_cell(source: str) -> dict:
    """Run ``source`` as a notebook cell runs: in a namespace named ``__main__``, so that its functions travel
    by value with the notebook's globals, as they do from a Jupyter kernel."""
    namespace = {"__name__": "__main__", "os": os, "time": time, "torch": torch, "signal": signal}
    exec(compile(textwrap.dedent(source), "<notebook cell>", "exec"), namespace)
    return namespace


CELL = notebook_cell("""
    def load_model(size):
        global model, loads
        model = torch.nn.Linear(size, 1)
        loads = globals().get("loads", 0) + 1
        return loads

    def model_shape():
        return tuple(model.weight.shape), loads   # names only the rank has: resolved in its namespace

    def all_reduce_rank():
        import torch.distributed as dist

        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        return value.item()

    def rank_zero_fails_while_one_waits():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            time.sleep(0.5)   # rank 1 is blocked in the all-reduce by now
            raise ValueError("rank 0 gave up")
        dist.all_reduce(torch.ones(1))

    kernel_value = 10   # a name the kernel has: sent with the function that uses it

    def add_kernel_value():
        global total
        total = kernel_value + int(os.environ["RANK"])
        return total
""")
load_model, model_shape, all_reduce_rank = CELL["load_model"], CELL["model_shape"], CELL["all_reduce_rank"]
rank_zero_fails_while_one_waits, add_kernel_value = CELL["rank_zero_fails_while_one_waits"], CELL["add_kernel_value"]


# ------------------------------------------------------------------------------------------------- state

@pytest.mark.parametrize("start_method", START_METHODS)
def test_state_lives_on_the_ranks_across_runs_and_cells(start_method, capsys):
    with Session(num_processes=2, start_method=start_method, display="text") as session:
        pids = session.pids
        assert session.run(load_model, args=(3,)) == 1
        assert session.run(model_shape, return_all=True) == [((1, 3), 1), ((1, 3), 1)]
        assert session.run(add_kernel_value, return_all=True) == [10, 11]
        assert session.pull("total") == [10, 11]  # `global total` set it on each rank

        session.push(scale=2.5)
        session.execute("scaled = total * scale\nscaled")
        assert session.pull("scaled") == [25.0, 27.5]
        out = capsys.readouterr().out
        assert "[rank 0] 25.0" in out and "[rank 1] 27.5" in out  # the cell's last value, labelled by rank

        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]  # the session's group, live
        assert session.pids == pids and session.status == "idle" and session.restarts == 0
        assert session.runs == 8
    assert session.status == "closed"
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)


def test_init_and_destroy_process_group_in_user_code_are_harmless():
    def ddp_script_style():
        import torch.distributed as dist

        dist.init_process_group("gloo")        # unconditional, as a DDP script does
        value = torch.ones(1)
        dist.all_reduce(value)
        dist.destroy_process_group()           # its last line
        return value.item(), dist.is_initialized()

    def accelerator_run():
        from notebook_accel import Accelerator

        accelerator = Accelerator()
        model, optimizer = accelerator.prepare(torch.nn.Linear(2, 1), torch.optim.SGD([torch.zeros(1)], lr=0.1))
        return accelerator.num_processes, accelerator.process_index

    with Session(num_processes=2, display="none") as session:
        assert session.run(ddp_script_style, return_all=True) == [(2.0, True), (2.0, True)]
        assert session.run(ddp_script_style, return_all=True) == [(2.0, True), (2.0, True)]
        assert session.run(accelerator_run, return_all=True) == [(2, 0), (2, 1)]
        assert session.run(accelerator_run, return_all=True) == [(2, 0), (2, 1)]


def test_large_tensors_go_through_shared_memory_once():
    data = torch.arange(1 << 21, dtype=torch.int64)  # 16 MiB

    with Session(num_processes=2, start_method="forkserver", display="none") as session:
        assert session.run(lambda tensor: int(tensor.sum()), args=(data,), return_all=True) == \
            [int(data.sum())] * 2
        assert data.is_shared()  # moved into shared memory in place, as torch.multiprocessing does
        moved_to = data.untyped_storage().data_ptr()
        session.push(big=data)
        assert data.untyped_storage().data_ptr() == moved_to  # sent again: the same shared memory, no copy
        assert session.pull("big")[1].equal(data)


def test_one_rank_session_runs_in_its_own_process():
    with Session(num_processes=1, display="none") as session:
        assert session.run(lambda: os.getpid()) != os.getpid()
        assert session.run(all_reduce_rank) == 1.0


# --------------------------------------------------------------------------------------- failure, recovery

def test_a_failure_while_a_peer_blocks_in_all_reduce_keeps_the_ranks_and_replaces_the_group():
    with Session(num_processes=2, display="none") as session:
        session.run(load_model, args=(4,))
        pids = session.pids
        started = time.monotonic()
        with pytest.raises(ValueError, match="rank 0 gave up") as raised:
            session.run(rank_zero_fails_while_one_waits)
        assert time.monotonic() - started < 30
        notes = " ".join(getattr(raised.value, "__notes__", []))
        assert "process group was replaced" in notes
        assert session.pids == pids and session.restarts == 0  # same processes, state kept
        assert session.run(model_shape) == ((1, 4), 1)
        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]  # the new group works


def test_a_plain_failure_on_every_rank_keeps_the_group():
    def both_fail():
        raise KeyError(f"rank {os.environ['RANK']}")

    with Session(num_processes=2, display="none") as session:
        with pytest.raises(KeyError) as raised:
            session.run(both_fail)
        assert not [note for note in getattr(raised.value, "__notes__", []) if "replaced" in note]
        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]


def test_a_timeout_interrupts_the_run_and_keeps_the_state():
    with Session(num_processes=2, display="none") as session:
        session.run(load_model, args=(2,))
        with pytest.raises(LaunchTimeout):
            session.run(time.sleep, args=(60,), timeout=1)
        assert session.run(model_shape, return_all=True) == [((1, 2), 1)] * 2
        assert session.restarts == 0


def test_kernel_interrupt_stops_the_run_on_every_rank_and_keeps_the_state():
    sleep_and_mark = notebook_cell("""
        def sleep_and_mark():
            global interrupted
            interrupted = False
            try:
                time.sleep(60)
            except KeyboardInterrupt:
                interrupted = True
                raise
    """)["sleep_and_mark"]
    with Session(num_processes=2, display="none") as session:
        session.run(load_model, args=(5,))

        timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))  # Jupyter's interrupt button
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                session.run(sleep_and_mark)
        finally:
            timer.cancel()
        assert time.monotonic() - started < 30
        assert session.pull("interrupted") == [True, True]
        assert session.run(model_shape) == ((1, 5), 1)


def test_a_rank_that_dies_restarts_the_session_and_says_state_is_lost():
    def rank_one_dies():
        if os.environ["RANK"] == "1":
            os._exit(3)
        all_reduce_rank()

    with Session(num_processes=2, display="none") as session:
        session.run(load_model, args=(2,))
        old = session.pids
        with pytest.raises(LaunchError, match="exited with code 3") as raised:
            session.run(rank_one_dies)
        assert any("ranks restarted: state lost" in note for note in raised.value.__notes__)
        assert session.restarts == 1 and set(session.pids).isdisjoint(old)
        with pytest.raises(NameError):
            session.run(model_shape)
        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]


def test_a_rank_stuck_past_recover_timeout_restarts_the_session():
    def rank_one_ignores_interrupts():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            raise RuntimeError("rank 0 failed")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as if stuck in C++ code
        time.sleep(120)

    with Session(num_processes=2, display="none", recover_timeout=1) as session:
        with pytest.raises(RuntimeError, match="rank 0 failed") as raised:
            session.run(rank_one_ignores_interrupts)
        notes = " ".join(raised.value.__notes__)
        assert "ranks restarted: state lost" in notes and "rank 1 did not stop within 1 s" in notes
        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]


# --------------------------------------------------------------------------------------- nothing left behind

def test_garbage_collection_ends_the_ranks():
    session = Session(num_processes=2, display="none")
    pids = session.pids
    del session
    gc.collect()
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 20, "the collected session's ranks to end")


def test_a_killed_kernel_takes_its_ranks_along():
    started = run_script("""
        import os, subprocess, sys
        from notebook_accel import Session
        session = Session(num_processes=2, display="none")
        print(" ".join(map(str, session.pids)), flush=True)
        os.kill(os.getpid(), 9)
    """)
    pids = [int(pid) for pid in started.stdout.split()]
    assert len(pids) == 2, started.stderr
    wait_until(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                               for pid in pids), 20, "the killed kernel's ranks to end")


# ------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("options, message", [
    ({"num_nodes": 2}, "several nodes and max_restarts are not supported for sessions"),
    ({"max_restarts": 1}, "several nodes and max_restarts are not supported for sessions"),
    ({"return_all": True}, "return_all is chosen per run"),
    ({"recover_timeout": 0}, "recover_timeout must be a positive number"),
    ({"bogus": 1}, "bogus"),
])
def test_options_a_session_cannot_take_are_refused_before_any_rank_starts(options, message):
    before = psutil.Process().children(recursive=True)
    with pytest.raises((LaunchConfigError, TypeError), match=message):
        Session(num_processes=2, display="none", **options)
    assert psutil.Process().children(recursive=True) == before


def test_an_unpicklable_capture_is_named_before_anything_is_sent():
    import threading as threads

    lock = threads.Lock()
    with Session(num_processes=1, display="none") as session:
        with pytest.raises(LaunchConfigError, match="captured variable 'lock'") as raised:
            session.run(lambda: lock.locked())
        assert "start_method='fork'" not in str(raised.value)  # no advice a session cannot follow
        assert session.run(lambda: 7) == 7 and session.runs == 1


def test_a_closed_session_says_so():
    session = Session(num_processes=1, display="none")
    session.close()
    session.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        session.run(len, args=((),))
