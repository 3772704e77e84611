"""Slurm pieces that need no cluster: what the kernel asks Slurm to do, recorded (issue 45's small points)."""
from __future__ import annotations

import sys

from notebook_accel.backends.slurm import allocation


def test_a_job_salloc_never_named_is_cancelled_by_a_name_only_it_has(monkeypatch):
    # salloc died before printing "Pending/Granted job allocation N": release() can only cancel by name. The name
    # used to be notebook_accel:<function>, shared by every launch of that function by the user (two notebooks).
    asked = []
    monkeypatch.setattr(allocation, "run_tool", lambda argv, timeout: asked.append(argv))
    names = {allocation.allocation_name("notebook_accel:train") for _ in range(20)}
    assert len(names) == 20 and all(name.startswith("notebook_accel:train.") for name in names)
    name = names.pop()
    # a "salloc" that exits at once without a word; its argv carries the job name as salloc's would
    dead = allocation.Allocation([sys.executable, "-c", "import sys; sys.exit(1)", f"--job-name={name}"])
    dead.process.wait(30)
    dead.release()
    assert [argv[:3] for argv in asked] == [["scancel", "--quiet", f"--name={name}"]]


def test_a_trials_events_are_read_whole_once_each_and_its_ending_only_once_complete(tmp_path):
    """The seam between a sweep's array task and the kernel (``backends.slurm.trial_folder``): a frame still being
    written is left for the next read, none is read twice; the ending is absent until written whole."""
    import os

    from notebook_accel.backends.slurm.trial_folder import EVENTS, Ending, TrialFolder
    from notebook_accel.wire.events import OutputLine

    writer, reader = TrialFolder(str(tmp_path / "0")), TrialFolder(str(tmp_path / "0"))
    writer.make(plan={"a": "plan"})
    assert writer.plan() == {"a": "plan"} and reader.read_events() == [] and reader.ending() is None
    writer.append(OutputLine(rank=0, stream="stdout", text="one"))
    writer.append(OutputLine(rank=1, stream="stdout", text="two"))
    whole = os.path.getsize(writer.file(EVENTS))
    with open(writer.file(EVENTS), "rb") as events:
        data = events.read()
    os.truncate(writer.file(EVENTS), whole - 3)   # the second frame half-written, as a reader may meet it
    assert [event.text for event in reader.read_events()] == ["one"]
    with open(writer.file(EVENTS), "wb") as events:
        events.write(data)
    assert [event.text for event in reader.read_events()] == ["two"] and reader.read_events() == []
    error = ValueError("bad config")
    error.__cause__ = RuntimeError("the rank's traceback")
    writer.finish(Ending("failed", 1.0, 2.0, error=__import__("cloudpickle").dumps((error, error.__cause__)),
                         error_text="ValueError: bad config"))
    raised = reader.ending().exception()
    assert type(raised) is ValueError and str(raised.__cause__) == "the rank's traceback"
    assert sorted(os.listdir(writer.path)) == ["ending", "events", "plan"]   # no partial file left
