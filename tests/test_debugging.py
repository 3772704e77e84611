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
