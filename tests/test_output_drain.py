"""Nothing a rank wrote is lost behind a slow front end, and a pipe held open by what the rank left behind
ends the launch anyway, with a word about it.

A rank that ended has closed its pipes; whatever it wrote before sits in them and is read to EOF however long
the view takes to show it (a notebook front end's stream, a remote terminal). Only a process that outlived its
rank (escaped the rank's process group with ``setsid``) can keep a pipe open: the launch stops waiting for it
once that pipe is silent, or after a bounded time if it keeps talking, and says that its lines may be missing.
A session's warm rank keeps its pipes: a run on it reads what the rank wrote, and stops reading such a process
after the same bounded time, and says so.
"""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from notebook_accel.launcher import start_launch
from notebook_accel.views import TextView

pytestmark = pytest.mark.timeout(240)

SECONDS_PER_LINE = 0.0001   # a front end that takes 0.1 ms to show a line (a notebook's stream object under load)
LINES = 30_000              # per rank: 3 s of showing each, far more than any fixed drain after the rank ended


class SlowStream(io.StringIO):
    """A display stream whose every line costs ``SECONDS_PER_LINE`` (the text view writes a block at a time)."""

    def write(self, text: str) -> int:
        time.sleep(SECONDS_PER_LINE * text.count("\n"))
        return super().write(text)


def print_lines_and_end(count):
    rank = os.environ["RANK"]
    for index in range(count):
        print(f"line {index} of {rank}")
    print(f"last line of {rank}", end="")  # no newline: the partial line still arrives


@pytest.mark.parametrize("num_processes", [2, 1], ids=["process-ranks", "in-kernel-rank"])
def test_a_slow_front_end_loses_no_line_of_ranks_that_ended(num_processes):
    out, err = SlowStream(), io.StringIO()
    job = start_launch(print_lines_and_end, args=(LINES,), num_processes=num_processes,
                       view=TextView(stdout=out, stderr=err))
    job.wait(180)
    shown = out.getvalue().split("\nnotebook_accel: ")[0].splitlines()  # the summary comes after
    for rank in range(num_processes):
        expected = [f"line {index} of {rank}" for index in range(LINES)] + [f"last line of {rank}"]
        assert job.outputs[rank] == expected, f"rank {rank}: {len(job.outputs[rank])} of {len(expected)} lines"
        mine = [line for line in shown if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] {line}" for line in expected]
    assert "may be missing" not in out.getvalue() + err.getvalue()


def leave_a_process_holding_the_output(script):
    """Start ``script`` in a new session (out of the rank's process group, as a daemon would), with this
    rank's stdout and stderr; report its pid and end."""
    child = subprocess.Popen(["setsid", "sh", "-c", script])
    print(f"left pid {child.pid}", flush=True)
    for index in range(200):
        print(f"rank line {index}")
    return "done"


def _kill_left_processes(outputs):
    for lines in outputs.values():
        for line in lines:
            if line.startswith("left pid "):
                try:
                    os.kill(int(line.split()[-1]), signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.parametrize("num_processes", [2, 1], ids=["process-ranks", "in-kernel-rank"])
@pytest.mark.parametrize("script, why", [
    ("exec sleep 120", "silent"),
    ("while :; do echo still here; sleep 0.1; done", "still writing"),
], ids=["silent", "chatty"])
def test_a_process_left_holding_the_pipes_ends_the_launch_and_is_said(num_processes, script, why):
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    job = start_launch(leave_a_process_holding_the_output, args=(script,), num_processes=num_processes,
                       view=TextView(stdout=out, stderr=err))
    try:
        assert job.wait(120) == "done"  # bounded: the launch does not wait for the escaped process
    finally:
        _kill_left_processes(job.outputs)
    elapsed = time.monotonic() - started
    assert elapsed < 60, elapsed
    for rank in range(num_processes):
        lines = job.outputs[rank]
        assert [line for line in lines if line.startswith("rank line ")] == [f"rank line {i}" for i in range(200)]
        notes = [line for line in lines if "may be missing" in line]
        assert any("its stdout" in note and why in note and "outlived" in note for note in notes), notes
        assert any(f"[rank {rank}] notebook_accel:" in line and "may be missing" in line
                   for line in err.getvalue().splitlines()), err.getvalue()[-2000:]


LONG_LINE = "still here " * 20   # few lines a second for the slow view: little memory, the pipe stays full


def leave_a_writer_on_the_output(pid_dir):
    """Print some lines, then start a process that leaves this rank's process group (``setsid``) and writes to
    the rank's stdout as fast as it can (its pid, which leads its own group, goes to ``pid_dir``)."""
    for index in range(200):
        print(f"rank line {index}")
    pid_file = os.path.join(pid_dir, os.environ["RANK"])
    # ``yes`` refills the pipe a block per system call: it stays ahead of the view even on a busy machine.
    script = f'echo $$ > {pid_file}; exec timeout 120 yes "{LONG_LINE}"'
    subprocess.Popen(["setsid", "sh", "-c", script])
    time.sleep(0.5)  # the writer has filled the pipe
    return "done"


def _kill_writers(pid_dir):
    for name in os.listdir(pid_dir):
        try:
            os.killpg(int(open(os.path.join(pid_dir, name)).read()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def test_a_session_run_ends_although_a_process_its_rank_left_keeps_writing(tmp_path, monkeypatch):
    # The rank is warm: its pipes stay open, so the run reads what it wrote before it said it was done — and a
    # process it started out of its group that writes faster than the front end shows must not keep the run
    # going: it is given up as a launch gives it up, with a line that says so.
    from notebook_accel import Session

    out, err = SlowStream(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    session = Session(num_processes=2, display="none")
    returned = {}

    def run_it():
        try:
            returned["value"] = session.run(leave_a_writer_on_the_output, args=(str(tmp_path),), return_all=True,
                                            display="text")
        except BaseException as error:  # shown by the assertion below
            returned["value"] = error

    try:
        started = time.monotonic()
        run = threading.Thread(target=run_it, daemon=True)
        run.start()
        run.join(90)
        ended = not run.is_alive()
        elapsed = time.monotonic() - started
        _kill_writers(tmp_path)
        run.join(60)  # with the writers gone the pipes go quiet
        assert ended, f"the run was still reading the escaped writers' output after {elapsed:.0f} s"
        assert returned["value"] == ["done", "done"]
        assert elapsed < 60, elapsed
        shown = out.getvalue().splitlines()
        for rank in range(2):
            mine = [line for line in shown if line.startswith(f"[rank {rank}] rank line ")]
            assert mine == [f"[rank {rank}] rank line {index}" for index in range(200)]
            notes = [line for line in err.getvalue().splitlines()
                     if line.startswith(f"[rank {rank}] notebook_accel:") and "may" in line]
            assert any("its stdout" in note and "still writing" in note for note in notes), (
                out.getvalue()[-2000:], err.getvalue()[-2000:])
    finally:
        _kill_writers(tmp_path)
        session.close()
