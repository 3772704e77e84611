"""Warm ranks (``Session``): real rank processes, a real gloo process group, kept across runs.

Each test starts its own session and closes it; the autouse fixture in conftest.py fails any test that leaves a
rank behind. Bounds on time are generous (they catch a hang, not a slow machine).
"""
from __future__ import annotations

import gc
import itertools
import linecache
import os
import signal
import textwrap
import threading
import time
import traceback

import psutil
import pytest
import torch

from notebook_accel import LaunchTimeout, Session
from notebook_accel.errors import LaunchConfigError, LaunchError
from notebook_accel.plan.devices import cuda_device_count
from notebook_accel.wire.events import SessionStatus
from scripts import run_script, running
from waiting import wait_until

pytestmark = pytest.mark.timeout(180)

START_METHODS = ["fork", "forkserver", "spawn"]


# ------------------------------------------------------------------------------- functions the tests run

_cells = itertools.count(1)


def notebook_cell(source: str) -> dict:
    """Run ``source`` as a notebook cell runs: in a namespace named ``__main__``, so that its functions travel
    by value with the notebook's globals, as they do from a Jupyter kernel; its source is in ``linecache``
    under a name of its own, as IPython keeps a cell's (no file on disk holds it)."""
    source = textwrap.dedent(source)
    filename = f"/notebook/cell-{next(_cells)}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__", "os": os, "time": time, "torch": torch, "signal": signal}
    exec(compile(source, filename, "exec"), namespace)
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

    def cuda_all_reduce():
        import torch.distributed as dist

        value = torch.tensor([float(dist.get_rank() + 1)], device=f"cuda:{os.environ['LOCAL_RANK']}")
        dist.all_reduce(value)
        return dist.get_backend(), value.item()

    def rank_zero_fails_while_one_waits_on_cuda():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            time.sleep(0.5)   # rank 1 is blocked in the all-reduce by now
            raise ValueError("rank 0 gave up")
        dist.all_reduce(torch.ones(1, device=f"cuda:{os.environ['LOCAL_RANK']}"))
        torch.cuda.synchronize()   # NCCL's all-reduce is queued on the GPU: this is where rank 1 waits

    def names_set_on_the_rank():
        return "model" in globals(), "lr" in globals()

    kernel_value = 10   # a name the kernel has: sent with the function that uses it

    def add_kernel_value():
        global total
        total = kernel_value + int(os.environ["RANK"])
        return total
""")
load_model, model_shape, all_reduce_rank = CELL["load_model"], CELL["model_shape"], CELL["all_reduce_rank"]
rank_zero_fails_while_one_waits, add_kernel_value = CELL["rank_zero_fails_while_one_waits"], CELL["add_kernel_value"]
names_set_on_the_rank = CELL["names_set_on_the_rank"]
cuda_all_reduce = CELL["cuda_all_reduce"]
rank_zero_fails_while_one_waits_on_cuda = CELL["rank_zero_fails_while_one_waits_on_cuda"]


# ------------------------------------------------------------------------------------------------- state

@pytest.mark.parametrize("start_method", START_METHODS)
def test_state_lives_on_the_ranks_across_runs_and_cells(start_method, capsys):
    with Session(num_processes=2, start_method=start_method, display="text") as session:
        # the session's line, on stdout with the runs' text (a notebook showed stderr's after a later run's output)
        assert capsys.readouterr().out.startswith("notebook_accel session: 2 ranks, cpu")
        pids = session.pids
        assert session.run(load_model, args=(3,)) == 1
        assert session.run(model_shape, return_all=True) == [((1, 3), 1), ((1, 3), 1)]
        assert session.run(add_kernel_value, return_all=True) == [10, 11]
        assert session.pull("total") == [10, 11]  # `global total` set it on each rank

        session.push(scale=2.5)
        session.execute("scaled = total * scale\nscaled")
        assert session.pull("scaled") == [25.0, 27.5]
        session.push(scale=4.0)  # a name the ranks hold already is replaced (a stale value would pull as 2.5)
        assert session.pull("scale") == [4.0, 4.0]
        out = capsys.readouterr().out
        assert "[rank 0] 25.0" in out and "[rank 1] 27.5" in out  # the cell's last value, labelled by rank

        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]  # the session's group, live
        assert session.pids == pids and session.status == "idle" and session.restarts == 0
        assert session.runs == 5  # run, run, run, execute, run: pull and push are not runs
        assert repr(session).endswith("idle, 5 runs, 0 restarts)")
    assert session.status == "closed" and session.status is SessionStatus.CLOSED
    assert not any(running(pid)
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


# ------------------------------------------------------------------------- whose names: the rank's or the kernel's

OWN_STATE = notebook_cell("""
    def load():
        global model
        model = torch.nn.Linear(8, 1)
        torch.nn.init.constant_(model.weight, 1.0)

    def peek():
        return model.weight.sum().item()
""")


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_a_kernel_name_never_replaces_what_a_rank_set(start_method, capsys):
    kernel = OWN_STATE
    with Session(num_processes=2, start_method=start_method, display="none") as session:
        session.run(kernel["load"])
        kernel["model"] = torch.nn.Linear(8, 1)  # the kernel has a `model` too: very common
        try:
            assert session.run(kernel["peek"], return_all=True) == [8.0, 8.0]  # the rank's, not the kernel's
            first = capsys.readouterr().err
            assert session.run(kernel["peek"]) == 8.0
            again = capsys.readouterr().err
        finally:
            del kernel["model"]
        assert session.run(kernel["peek"]) == 8.0  # ... and it is still there once the kernel's is gone
        assert [model.weight.sum().item() for model in session.pull("model")] == [8.0, 8.0]
        session.execute("model.weight.sum().item()")
        assert "[rank 0] 8.0" in capsys.readouterr().out
    assert "`model`" in first and "kernel" in first and len(first.strip().splitlines()) == 1, first
    assert "`model`" not in again  # said once


KERNEL_NAMES = notebook_cell("""
    lr = 0.1

    def current_lr():
        return lr

    def scaled(x):          # a helper in the kernel ...
        return x * factor   # ... using a name only the ranks have

    def use_helper():
        return scaled(2)

    def activation(x):
        return torch.relu(x) + offset

    offset = 1.0

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 1)
            torch.nn.init.constant_(self.fc.weight, 1.0)
            torch.nn.init.constant_(self.fc.bias, 0.0)

        def forward(self, x):
            return activation(self.fc(x))   # a kernel helper, called later from a %%ranks cell

    def build():
        global net
        net = Net()
""")


def test_the_kernels_names_fill_what_a_rank_lacks_and_follow_the_kernel(capsys):
    kernel, said = KERNEL_NAMES, []

    def printed() -> str:
        shown = capsys.readouterr()
        said.append(shown.err)
        return shown.out

    with Session(num_processes=2, display="none") as session:
        session.execute("import torch")  # the rank's own `torch`: the very module the kernel's is, no note
        assert session.run(kernel["current_lr"]) == 0.1
        kernel["lr"] = 0.5
        try:
            assert session.run(kernel["current_lr"], return_all=True) == [0.5, 0.5]  # never the rank's own
        finally:
            kernel["lr"] = 0.1
        session.push(factor=3)
        assert session.run(kernel["use_helper"]) == 6
        build = kernel["build"]
        session.run(build)
        session.execute("net(torch.ones(1, 2)).item()")  # Net.forward's helper is on the rank
        assert "[rank 0] 3.0" in printed()
        kernel["offset"] = 10.0
        try:
            session.run(build)  # the kernel's helpers and values, as they are now
            session.execute("net(torch.ones(1, 2)).item()")
            assert "[rank 1] 12.0" in printed()
        finally:
            kernel["offset"] = 1.0
    printed()
    assert "kernel" not in "".join(said), said  # nothing of the rank's was shadowed


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


@pytest.mark.cuda
@pytest.mark.skipif(cuda_device_count() < 2, reason="needs 2 CUDA devices (NCCL): none here")
def test_a_session_on_two_gpus_keeps_its_nccl_group_and_replaces_it_after_a_failure_mid_collective():
    # Where the hardware is: README "one process group for the session's life (nccl on CUDA)" and "NCCL
    # communicators are aborted" when a peer failed in the middle of a collective.
    with Session(num_processes=2, device="cuda", display="none") as session:
        assert session.run(cuda_all_reduce, return_all=True) == [("nccl", 3.0)] * 2
        pids = session.pids
        with pytest.raises(ValueError, match="rank 0 gave up") as raised:
            session.run(rank_zero_fails_while_one_waits_on_cuda)
        assert "process group was replaced" in " ".join(getattr(raised.value, "__notes__", []))
        assert session.pids == pids and session.restarts == 0
        assert session.run(cuda_all_reduce, return_all=True) == [("nccl", 3.0)] * 2  # the new group works


def test_a_plain_failure_on_every_rank_keeps_the_group():
    def both_fail():
        raise KeyError(f"rank {os.environ['RANK']}")

    with Session(num_processes=2, display="none") as session:
        with pytest.raises(KeyError) as raised:
            session.run(both_fail)
        assert not [note for note in getattr(raised.value, "__notes__", []) if "replaced" in note]
        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]


def test_debug_on_a_rank_that_did_not_fail_says_so_in_one_line():
    # Issue 36: it printed a remote traceback through four library frames (the rank's debug task raising).
    def rank_1_fails():
        if os.environ["RANK"] == "1":
            raise KeyError("labels")
        return 0

    with Session(num_processes=2, display="none") as session:
        with pytest.raises(RuntimeError, match="no run of this session has failed: there is nothing to debug"):
            session.debug()
        with pytest.raises(KeyError):
            session.run(rank_1_fails)
        with pytest.raises(RuntimeError) as raised:
            session.debug(rank=0)
        assert str(raised.value) == "rank 0 did not fail in the last run (rank 1 did)"
        assert raised.value.__cause__ is None and raised.value.__context__ is None  # no remote traceback
        assert [entry.name for entry in raised.traceback] == [
            "test_debug_on_a_rank_that_did_not_fail_says_so_in_one_line", "debug"]  # raised in the kernel, at once
        assert session.run(lambda: 7) == 7  # and the session goes on


def test_a_timeout_interrupts_the_run_and_keeps_the_state(capsys):
    with Session(num_processes=2, display="text") as session:
        session.run(load_model, args=(2,))
        capsys.readouterr()
        with pytest.raises(LaunchTimeout, match=r"^the run ran past timeout=1 s"):  # a run, not a launch
            session.run(time.sleep, args=(60,), timeout=1)
        summary = capsys.readouterr().out
        assert "[rank 0] stopped" in summary and "[rank 1] stopped" in summary, summary  # as a launch's ranks
        assert "failed" not in summary, summary
        assert session.run(model_shape, return_all=True) == [((1, 2), 1)] * 2
        assert session.restarts == 0


def test_kernel_interrupt_stops_the_run_on_every_rank_and_keeps_the_state(capsys):
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
    with Session(num_processes=2, display="text") as session:
        session.run(load_model, args=(5,))
        capsys.readouterr()

        timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))  # Jupyter's interrupt button
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt) as raised:
                session.run(sleep_and_mark)
        finally:
            timer.cancel()
        assert time.monotonic() - started < 30
        summary = capsys.readouterr().out
        assert "[rank 0] stopped" in summary and "[rank 1] stopped" in summary, summary
        # The traceback ends at the session call: no frame of the kernel's waiting (selectors, threading).
        frames = traceback.extract_tb(raised.value.__traceback__)
        assert [frame.filename for frame in frames
                if frame.filename != __file__ and "notebook_accel" not in frame.filename] == [], frames
        assert session.pull("interrupted") == [True, True]
        assert session.run(model_shape) == ((1, 5), 1)


def test_restart_starts_new_processes_with_a_new_group_and_the_state_is_gone():
    # README: "new processes, a new process group: the state is gone".
    with Session(num_processes=2, display="none") as session:
        session.run(load_model, args=(3,))
        session.push(lr=0.5)
        assert session.run(names_set_on_the_rank, return_all=True) == [(True, True)] * 2
        before = session.pids
        session.restart()
        assert session.restarts == 1 and session.status == "idle"
        assert set(session.pids).isdisjoint(before) and len(session.pids) == 2
        assert not any(running(pid)
                       for pid in before)  # the old ranks are gone
        assert session.run(names_set_on_the_rank, return_all=True) == [(False, False)] * 2
        with pytest.raises(NameError):
            session.run(model_shape)
        assert session.run(all_reduce_rank, return_all=True) == [3.0, 3.0]  # the new group works
        assert session.run(load_model, args=(2,)) == 1  # a fresh namespace: the first load again


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


def test_the_session_row_says_what_happened_last_and_only_until_the_next_run(capsys):
    def rank_one_dies():
        if os.environ["RANK"] == "1":
            os._exit(3)

    def rank_one_is_stuck():
        if os.environ["RANK"] == "1":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as if stuck in C++ code
            time.sleep(120)
        raise RuntimeError("rank 0 failed")

    with Session(num_processes=2, display="text", recover_timeout=1) as session:
        summaries = []
        show = session.view.update
        session.view.update = lambda summary: (summaries.append(summary), show(summary))
        with pytest.raises(ValueError):
            session.run(rank_zero_fails_while_one_waits)
        assert "the process group was replaced" in (summaries[-1].notice or ""), summaries[-1]
        assert session.run(all_reduce_rank) == 3.0
        assert summaries[-1].notice is None, summaries[-1]  # a later run: the row no longer says "last: ..."
        capsys.readouterr()
        with pytest.raises(LaunchError):
            session.run(rank_one_dies)
        restarted = capsys.readouterr().out
        with pytest.raises(RuntimeError):
            session.run(rank_one_is_stuck)
        restarted_again = capsys.readouterr().out
    closed = capsys.readouterr().out
    assert "ranks restarted: state lost (rank 1 died)" in restarted, restarted  # this restart's reason
    assert "did not stop within 1 s" in restarted_again and "rank 1 died" not in restarted_again, restarted_again
    assert "closed" in closed and "restarted:" not in closed, closed


# ------------------------------------------------------------------------------------ what a user sees

def test_a_ranks_cell_shows_what_it_printed_when_the_dashboard_is_off(capsys):
    with Session(num_processes=2, display="none") as session:
        session.execute("import os, sys\nprint('hello from', os.environ['RANK'])\n"
                        "print('careful', file=sys.stderr)\nint(os.environ['RANK']) * 10")
        shown = capsys.readouterr()
        assert "[rank 0] hello from 0" in shown.out and "[rank 1] hello from 1" in shown.out, shown
        assert "[rank 0] 0" in shown.out and "[rank 1] 10" in shown.out, shown  # the last expression's value
        assert "[rank 1] careful" in shown.err, shown
        assert "notebook_accel" not in shown.out + shown.err  # and nothing else: the dashboard is off
        session.run(print, args=("from a run",))  # a function's prints follow `display`, as a launch's do
        assert "from a run" not in capsys.readouterr().out


FAILS = notebook_cell("""
    def fails(step):
        loss = step * 2
        raise ValueError(f"loss {loss} at step {step}")
""")["fails"]


def test_a_run_traceback_shows_the_users_source_lines():
    with Session(num_processes=2, display="none") as session:
        with pytest.raises(ValueError, match="loss 6 at step 3") as raised:
            session.run(FAILS, args=(3,))
    remote = str(raised.value.__cause__)
    assert 'raise ValueError(f"loss {loss} at step {step}")' in remote, remote
    assert "/notebook/cell-" in remote and "<dynamic-code>" not in remote, remote


def test_a_fork_server_launch_traceback_shows_the_users_source_lines_too():
    from notebook_accel import notebook_launcher

    with pytest.raises(ValueError, match="loss 2 at step 1") as raised:
        notebook_launcher(FAILS, args=(1,), num_processes=2, start_method="forkserver", display="none")
    remote = str(raised.value.__cause__)
    assert 'raise ValueError(f"loss {loss} at step {step}")' in remote and "<dynamic-code>" not in remote, remote


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
    wait_until(lambda: not any(running(pid)
                               for pid in pids), 20, "the killed kernel's ranks to end")


# ------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("options, message", [
    ({"num_nodes": 2}, r"^Session: Session\(num_nodes=2\): a session's ranks span several nodes only with "
                       r"cluster='slurm' \(on Ray the cluster places them; for torch elastic's nodes, "
                       r"notebook_launcher\)$"),
    ({"node_rank": 1}, "^Session: unexpected keyword argument 'node_rank': notebook_launcher, start_launch and "
                       "launch_panel take it, Session does not$"),
    ({"max_restarts": 1}, "^Session: unexpected keyword argument 'max_restarts': .* take it, Session does not$"),
    ({"return_all": True}, "^Session: unexpected keyword argument 'return_all': .*Session.run take it"),
    ({"recover_timeout": 0}, "^Session: recover_timeout must be a positive number"),
    ({"bogus": 1}, "^Session: unexpected keyword argument 'bogus'$"),
    ({"dispaly": "none"}, "did you mean 'display'"),
])
def test_options_a_session_cannot_take_are_refused_before_any_rank_starts(options, message):
    before = psutil.Process().children(recursive=True)
    with pytest.raises(LaunchConfigError, match=message):
        Session(num_processes=2, display="none", **options)
    assert psutil.Process().children(recursive=True) == before


def test_a_runs_options_are_checked_as_the_sessions_are():
    with Session(num_processes=1, display="none") as session:
        with pytest.raises(LaunchConfigError, match="^Session.run: display='bogus' is not one of 'auto', "):
            session.run(len, args=((),), display="bogus")  # was accepted, and showed text
        with pytest.raises(LaunchConfigError, match="^Session.execute: timeout must be None or a positive number"):
            session.execute("1", timeout=-5)
        assert session.runs == 0
        assert session.run(len, args=((),), display="none", timeout=30) == 0


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
