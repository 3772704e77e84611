"""What people debug, with real ranks (gloo, real processes): tracebacks, metrics, resources, OOM."""
from __future__ import annotations

import os
import sys
import traceback

import pytest

from notebook_accel import notebook_launcher

pytestmark = pytest.mark.timeout(180)


# ----------------------------------------------------------------------------------------- tracebacks

def user_step():
    raise ValueError("bad batch in the user's code")


def train_that_fails():
    if int(os.environ["RANK"]) == 0:
        user_step()
    return "rank 1 ends normally"


def test_the_rank_traceback_starts_in_the_users_function():
    with pytest.raises(ValueError, match="bad batch") as caught:
        notebook_launcher(train_that_fails, num_processes=2, display="none")
    remote = caught.value.__cause__
    frames = [line.strip() for line in remote.traceback_text.splitlines() if line.strip().startswith("File ")]
    assert frames[0].endswith("in train_that_fails"), remote.traceback_text
    assert frames[-1].endswith("in user_step")
    assert "worker.py" not in remote.traceback_text and "hidden" in remote.traceback_text
    # still reachable for a bug report
    assert "notebook_accel/worker.py" in remote.full_text and "in user_step" in remote.full_text


def test_inline_run_raises_with_the_users_frames_and_hides_the_launchers():
    with pytest.raises(ValueError, match="bad batch") as caught:
        notebook_launcher(user_step, num_processes=1, display="none")
    frames = traceback.extract_tb(caught.value.__traceback__)
    names = [frame.name for frame in frames]
    assert names[-1] == "user_step"  # the user's frames survive (they were lost before this issue)
    launcher_frames = [frame for frame in frames if "notebook_accel" in frame.filename]
    assert [frame.name for frame in launcher_frames] == ["notebook_launcher", "run", "wait"]
    # ... and each of those is one IPython and pytest fold (``__tracebackhide__``)
    tb = caught.value.__traceback__
    hidden = []
    while tb is not None:
        if "notebook_accel" in tb.tb_frame.f_code.co_filename:
            hidden.append(tb.tb_frame.f_locals.get("__tracebackhide__", False))
        tb = tb.tb_next
    assert hidden == [True, True, True]


# ----------------------------------------------------------------------------------------- metrics

def report_every_step(steps):
    from notebook_accel import report

    rank = int(os.environ["RANK"])
    for step in range(steps):  # a tight loop: many calls are merged into one event, none may be lost
        report(step=step, loss=1.0 / (step + 1) + rank, acc=step * 0.001)
    report(epoch_time=1.5 + rank)  # no step


def test_launch_metrics_has_every_reported_value():
    import pandas

    from notebook_accel.launcher import last_launch, start_launch

    job = start_launch(report_every_step, args=(3000,), num_processes=2, display="none")
    job.wait(120)
    frame = job.metrics
    assert isinstance(frame, pandas.DataFrame) and list(frame.columns) == ["rank", "step", "time", "name", "value"]
    assert len(frame) == 2 * (3000 * 2 + 1)
    for rank in (0, 1):
        loss = frame[(frame["rank"] == rank) & (frame["name"] == "loss")].sort_values("step")
        assert list(loss["step"]) == list(range(3000))
        assert loss["value"].tolist() == [1.0 / (step + 1) + rank for step in range(3000)]
        epoch = frame[(frame["rank"] == rank) & (frame["name"] == "epoch_time")]
        assert epoch["value"].tolist() == [1.5 + rank] and epoch["step"].isna().all()
    assert last_launch() is job
    # without pandas: plain rows
    rows = job.metric_log.rows()
    assert rows[0]._fields == ("rank", "step", "time", "name", "value") and len(rows) == len(frame)
