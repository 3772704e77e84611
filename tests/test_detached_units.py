"""The detached core without a cluster: the job folder's event log (order, a torn last frame, a killed writer's tail),
the ending written once and atomically, the ending re-raising the rank's exception as an attached launch raises it,
and ``attach`` replaying a folder into a view."""
from __future__ import annotations

import os
import pickle
import threading
import time

import pytest

from notebook_accel.detached import DetachedJob, Ending, JobFolder, RecordingView, attach, detached_jobs
from notebook_accel.detached.log import HEADER, LogReader, LogWriter, frame
from notebook_accel.errors import RemoteTraceback
from notebook_accel.wire.events import LaunchFinished, LaunchStarted, OutputLine, Status


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_JOBS", str(tmp_path / "jobs"))
    return tmp_path / "jobs"


def lines(count, start=0):
    return [OutputLine(rank=index % 2, stream="stdout", text=f"line {index}") 
            for index in range(start, start + count)]


def test_the_log_replays_every_event_in_order_from_any_index(tmp_path):
    writer = LogWriter(str(tmp_path / "events.log"))
    for event in lines(50):
        writer.append(event)
    reader = LogReader(str(tmp_path / "events.log"))
    assert [event.text for event in reader.read(0)] == [f"line {index}" for index in range(50)]
    assert [event.text for event in reader.read(48)] == ["line 48", "line 49"]
    assert [event.text for event in reader.read(10)][:1] == ["line 10"]   # back to an earlier index: read again
    writer.close()


def test_a_frame_still_being_written_is_read_once_whole_later(tmp_path):
    path = tmp_path / "events.log"
    LogWriter(str(path)).append(OutputLine(rank=0, stream="stdout", text="first"))
    reader = LogReader(str(path))
    assert [event.text for event in reader.read(0)] == ["first"]
    torn = frame(OutputLine(rank=1, stream="stdout", text="second"))
    for cut in (2, HEADER.size, HEADER.size + 3, len(torn) - 1):   # the writer is in the middle of its write
        with open(path, "ab") as file:
            file.write(torn[:cut])
        assert reader.read(1) == []
        os.truncate(path, os.path.getsize(path) - cut)
    with open(path, "ab") as file:   # a network file system showing the size before the bytes: zeros at first
        file.write(torn[:HEADER.size] + b"\0" * (len(torn) - HEADER.size))
    assert reader.read(1) == []
    os.truncate(path, os.path.getsize(path) - len(torn))
    with open(path, "ab") as file:
        file.write(torn)
    assert [event.text for event in reader.read(1)] == ["second"]
    assert reader.read(2) == []


def test_a_killed_writers_torn_tail_is_cut_by_the_next_writer(tmp_path):
    path = tmp_path / "events.log"
    LogWriter(str(path)).append(OutputLine(rank=0, stream="stdout", text="before the kill"))
    with open(path, "ab") as file:
        file.write(frame(OutputLine(rank=0, stream="stdout", text="torn"))[:-4])
    again = LogWriter(str(path))   # the requeued job's driver
    again.append(OutputLine(rank=0, stream="stdout", text="after the restart"))
    assert [event.text for event in LogReader(str(path)).read(0)] == ["before the kill", "after the restart"]


def test_a_reader_following_a_writer_gets_every_event_once(tmp_path):
    path = str(tmp_path / "events.log")
    writer = LogWriter(path)
    total = 400
    thread = threading.Thread(target=lambda: [writer.append(event) for event in lines(total)])
    thread.start()
    reader, seen = LogReader(path), []
    while len(seen) < total:
        seen.extend(event.text for event in reader.read(len(seen)))
    thread.join()
    assert seen == [f"line {index}" for index in range(total)]


def test_the_ending_is_written_once_and_atomically(jobs):
    folder = JobFolder.create("local-test", "train")
    assert folder.read(0) == ([], None)
    folder.finish(Ending.finished({"loss": 0.5}, elapsed=3.0))
    folder.finish(Ending("stopped"))   # a cancel racing the driver's own ending: the first stays
    events, ending = folder.read(0)
    assert ending.status == "finished" and ending.outcome() == {"loss": 0.5}
    assert sorted(os.listdir(folder.path)) == ["ending", "record.json"]   # no temporary file left


def rank_error():
    error = ValueError("loss is nan at step 7")
    error.add_note("(notebook_accel: raised in rank 1 of 2)")
    error.rank = 1
    error.__cause__ = RemoteTraceback('\n"""\n[rank 1] Traceback (most recent call last):\n  File "x.py", line 3, '
                                      'in train\nValueError: loss is nan at step 7\n"""')
    return error


def test_a_failed_endings_exception_is_the_ranks_own_with_its_traceback():
    ending = pickle.loads(pickle.dumps(Ending.raised("failed", rank_error(), elapsed=1.0)))
    with pytest.raises(ValueError, match="loss is nan at step 7") as raised:
        ending.outcome()
    assert raised.value.rank == 1 and raised.value.__notes__ == ["(notebook_accel: raised in rank 1 of 2)"]
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert "[rank 1] Traceback" in str(raised.value.__cause__)


def test_an_exception_that_does_not_pickle_keeps_its_words():
    class Local(Exception):
        def __reduce__(self):
            raise TypeError("no")

    error = Local("the words")
    error.__cause__ = RemoteTraceback("[rank 0] Traceback ...")
    ending = Ending.raised("failed", error, elapsed=1.0)
    with pytest.raises(Exception, match="the words") as raised:
        ending.outcome()
    assert "[rank 0] Traceback" in str(raised.value.__cause__)


class Recorder:
    def __init__(self):
        self.events = []

    def handle(self, event):
        self.events.append(event)

    def tick(self):
        pass


class FakeLaunch:
    status, result, error = Status.FINISHED, [1, 2], None


def test_attach_replays_a_recorded_launch_and_returns_its_result(jobs, monkeypatch):
    folder = JobFolder.create("local-test", "train")
    recording = RecordingView(folder)
    recorded = [LaunchStarted(rank=-1, world_size=2, device="cpu", start_method="slurm")] + lines(5) + [
        LaunchFinished(rank=-1, status=Status.FINISHED, elapsed=1.0)]
    for event in recorded:
        recording.handle(event)
    recording.finish(FakeLaunch(), elapsed=1.0)
    shown = Recorder()
    monkeypatch.setattr("notebook_accel.detached.attaching.make_view", lambda display: shown)
    assert attach(folder.id) == [1, 2]
    assert shown.events == recorded
    job = DetachedJob(folder.id)
    assert job.status == "finished" and job.wait(timeout=5) == [1, 2]
    assert list(detached_jobs()["id"]) == [folder.id]
    job.forget()
    assert not os.path.exists(folder.path) and len(detached_jobs()) == 0


def test_attach_to_an_unknown_id_names_the_known_ones(jobs):
    JobFolder.create("local-test", "train")
    with pytest.raises(LookupError, match="no detached job 'nope'.*detached_jobs"):
        attach("nope")


# ------------------------------------------------------------------------------------- refusals, before any process

def hold():
    pass


@pytest.mark.parametrize("options, refusal", [
    (dict(num_processes=2), "detach=True is not supported for ranks on this machine (cluster=None) yet"),
    (dict(num_processes=2, num_nodes=2, rdzv_endpoint="127.0.0.1:29400"),
     "detach=True is not supported for torch elastic's nodes"),
    (dict(device="xla"), "detach=True is not supported on a TPU (device='xla') yet"),
])
def test_detach_is_refused_where_no_job_outlives_the_kernel(jobs, options, refusal):
    from notebook_accel import start_launch
    from notebook_accel.errors import LaunchConfigError

    with pytest.raises(LaunchConfigError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        start_launch(hold, detach=True, display="none", **options)
    assert not jobs.exists()   # nothing written, nothing started


def test_detach_is_refused_with_what_needs_a_live_kernel(jobs, monkeypatch):
    from notebook_accel import start_launch
    from notebook_accel.errors import LaunchConfigError
    from notebook_accel.plan.options import LaunchOptions
    from notebook_accel.plan.plan import make_plan

    with pytest.raises(LaunchConfigError, match="view= cannot go with detach=True"):
        start_launch(hold, num_processes=2, num_nodes=2, cluster="slurm", detach=True, view=Recorder())
    monkeypatch.setenv("SLURM_JOB_ID", "7")   # inside an allocation: planned as a batch job of its own all the same
    with pytest.raises(LaunchConfigError, match="pdb=True cannot go with detach=True"):
        make_plan(hold, (), None, LaunchOptions.checked(num_processes=2, num_nodes=2, cluster="slurm", detach=True,
                                                        pdb=True))
    with pytest.raises(LaunchConfigError, match="detach must be True or False"):
        start_launch(hold, num_processes=2, cluster="slurm", detach="yes")
    assert not jobs.exists()


def test_a_detached_launch_inside_an_allocation_asks_for_a_job_of_its_own(monkeypatch):
    from notebook_accel.plan.options import LaunchOptions
    from notebook_accel.plan.plan import make_plan

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    options = dict(num_processes=2, num_nodes=2, cluster="slurm", device="cpu", slurm={"time": "10"})
    plan = make_plan(hold, (), None, LaunchOptions.checked(detach=True, **options))
    assert plan.site.allocation is None and plan.site.request_options == {"time": "10"}


def test_a_displayed_handle_replays_then_follows_the_job_live(jobs, monkeypatch):
    folder = JobFolder.create("local-test", "train")
    first = [LaunchStarted(rank=-1, world_size=2, device="cpu", start_method="slurm")] + lines(3)
    for event in first:
        folder.append(event)
    shown = Recorder()
    monkeypatch.setattr("notebook_accel.detached.attaching.make_view", lambda display: shown)
    DetachedJob(folder.id)._ipython_display_()
    assert shown.events == first   # replayed in the cell that displayed it, before it returns
    later = lines(3, start=3) + [LaunchFinished(rank=-1, status=Status.FINISHED, elapsed=1.0)]
    for event in later:
        folder.append(event)
    folder.finish(Ending.finished(None, elapsed=1.0))
    deadline = time.monotonic() + 10
    while len(shown.events) < len(first + later) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert shown.events == first + later


class BetweenStates:
    """A source whose cluster answers "not listed" once (a requeue between two states), then lists the job again,
    then writes its ending."""

    def __init__(self, answers):
        self.answers = list(answers)

    def read(self, since):
        return [], (Ending.finished("done", 1.0) if not self.answers else None)

    def cluster_state(self):
        return self.answers.pop(0) if self.answers else "running"

    def ending(self):
        return None


def test_one_not_listed_answer_does_not_call_a_requeued_job_lost_two_in_a_row_do(monkeypatch):
    from notebook_accel.detached import attaching
    from notebook_accel.views import NullView

    monkeypatch.setattr(attaching, "LOST_CHECK", 0.0)
    assert attaching.follow(BetweenStates([None, "pending", "running"]), NullView(), poll=0.01).status == "finished"
    assert attaching.follow(BetweenStates([None, None, "running"]), NullView(), poll=0.01).status == "lost"
