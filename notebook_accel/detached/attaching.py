"""Attaching to a detached launch from any kernel: ``attach(job)`` replays its events into the ordinary dashboard, then
follows them live until the launch ends, and returns or raises what ``notebook_launcher`` would have.

``DetachedJob`` is the handle (``start_launch(..., detach=True)`` returns one; ``DetachedJob(id)`` makes one from an
id); ``detached_jobs()`` lists one's jobs. The job's events come from an ``EventSource``: a job folder for Slurm.
"""
from __future__ import annotations

import importlib
import threading
import time
from typing import Any, Dict, List, Optional, Union

from ..outcome.shown import show_from_the_call
from ..views import View, make_view
from ..wire.choices import DisplayName
from ..wire.events import LaunchFinished, Status
from .ending import Ending
from .folder import find_job, job_folders
from .protocol import EventSource

POLL = 0.2           # seconds between two reads of a live job's log
LOST_CHECK = 5.0     # seconds between two questions to the cluster: does the job still exist?


def follow(source: EventSource, view: View, *, poll: float = POLL, since: int = 0,
           stop: Optional[threading.Event] = None, deadline: Optional[float] = None) -> Optional[Ending]:
    """Feed ``view`` every event of ``source`` from ``since`` until the ending, and return it. None: ``stop`` was set
    or ``deadline`` (a ``time.monotonic()``) passed first. A job its cluster no longer knows (at two checks in a row), with no ending, ended
    without a record (killed with its driver, its node lost): it ends "lost"."""
    last_check = time.monotonic()
    gone_before = False   # the cluster did not list the job at the last check either
    while True:
        events, ending = source.read(since)
        for event in events:
            view.handle(event)
        since += len(events)
        if ending is not None:
            return ending
        now = time.monotonic()
        if now - last_check > LOST_CHECK:
            last_check = now
            lost = _lost(source)
            # twice in a row, LOST_CHECK apart: one answer can fall between two states of a requeue
            lost, gone_before = (lost if gone_before else None), lost is not None
            if lost is not None:
                view.handle(LaunchFinished(rank=-1, status=Status.STOPPED, elapsed=0.0, error=lost.error_text))
                return lost
        if (stop is not None and stop.is_set()) or (deadline is not None and now > deadline):
            return None
        view.tick()
        time.sleep(poll)


def _lost(source: EventSource) -> Optional[Ending]:
    state = getattr(source, "cluster_state", None)
    if state is None or state() is not None:
        return None
    written = getattr(source, "ending", None)
    if written is not None and written() is not None:
        return None  # it ended between the two reads: the next read has it
    return Ending("lost", error_text="the detached job ended without recording how (cancelled, or its node or driver "
                                     "was killed); its events up to then were kept")


JobLike = Union[str, "DetachedJob", EventSource]

# Jobs kept elsewhere than in a job folder, by the start of their id: the module whose ``source(id)`` is the job's
# ``EventSource`` and whose ``jobs()`` lists those the kernel can reach (imported only when such an id is asked for).
ELSEWHERE = {"ray-": "notebook_accel.backends.ray.detached"}


def source_of(job: JobLike) -> EventSource:
    """The event source of a job given by id, handle or source."""
    if isinstance(job, DetachedJob):
        return job.source
    if isinstance(job, str):
        for prefix, module in ELSEWHERE.items():
            if job.startswith(prefix):
                return importlib.import_module(module).source(job)
        return find_job(job)
    return job


def attach(job: JobLike, display: DisplayName = "auto") -> Any:
    """Show a detached launch's dashboard (its events so far, then live) and return its result, or raise its root
    cause exactly as ``notebook_launcher`` would have (the rank's own exception type, message and traceback, naming
    the rank and its node).

    ``job``: its id (``detached_jobs()`` lists them), or its ``DetachedJob``. Interrupting (Ctrl-C) stops following,
    not the job: it runs on; attach again later, or ``DetachedJob(id).cancel()``.

    >>> job = start_launch(train, num_processes=8, num_nodes=2, cluster="slurm", detach=True)   # doctest: +SKIP
    >>> # ... the kernel restarts ...
    >>> state = notebook_accel.attach(job.id)                                                  # doctest: +SKIP
    """
    __tracebackhide__ = True  # noqa: F841
    source = source_of(job)
    view = make_view(display)
    try:
        ending = follow(source, view)
    except KeyboardInterrupt:
        raise show_from_the_call(KeyboardInterrupt(
            f"stopped following detached job {_id_of(source)}; it runs on: attach to it again, or cancel() it"))
    assert ending is not None
    try:
        return ending.outcome()
    except BaseException as error:
        raise show_from_the_call(error) from error.__cause__


def _id_of(source: EventSource) -> str:
    return getattr(source, "id", None) or source.describe()["id"]


class DetachedJob:
    """A detached launch, from the kernel that started it or any later one.

    ``id``; ``status`` (the job's state: pending, running, finished, failed, stopped, lost...); ``attach(display)``
    (the dashboard, then the result); ``wait(timeout)`` (the result, no dashboard); ``cancel()`` (ends the job on its
    cluster); ``forget()`` (deletes everything kept of it, cancelling it first if it still runs). Displayed in a
    notebook, it shows the dashboard, replayed then live.

    >>> job = DetachedJob("20261129-034512-3fa2")   # doctest: +SKIP
    >>> job.status, job.wait()                       # doctest: +SKIP
    """

    def __init__(self, job: Union[str, EventSource]) -> None:
        self.source: EventSource = source_of(job)

    @property
    def id(self) -> str:
        return _id_of(self.source)

    @property
    def status(self) -> str:
        return self.source.describe()["state"]

    def describe(self) -> Dict[str, Any]:
        return self.source.describe()

    def attach(self, display: DisplayName = "auto") -> Any:
        """``attach(self, display)``."""
        __tracebackhide__ = True  # noqa: F841
        return attach(self, display)

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the job ends; return its result or raise its root cause. ``TimeoutError`` after ``timeout``."""
        __tracebackhide__ = True  # noqa: F841
        from ..views import NullView

        ending = follow(self.source, NullView(), deadline=None if timeout is None else time.monotonic() + timeout)
        if ending is None:
            raise TimeoutError(f"detached job {self.id} is still running after {timeout} s")
        return ending.outcome()

    def cancel(self) -> None:
        """End the job (Slurm: ``scancel``); its ending then says "stopped". Its record stays until ``forget()``."""
        self.source.cancel()

    def forget(self) -> None:
        """Delete everything kept of the job (its folder), cancelling it first if it still runs."""
        self.source.forget()

    def __repr__(self) -> str:
        try:
            row = self.source.describe()
        except Exception:  # forgotten
            return f"DetachedJob({self.id!r}: forgotten)"
        return f"DetachedJob({row['id']!r}: {row['function']} on {row['cluster']}, {row['state']})"

    def _ipython_display_(self) -> None:
        """In a notebook: the dashboard, its events so far replayed in this cell, then followed live in a thread."""
        view = make_view("auto")
        source = self.source
        events, ending = source.read(0)
        for event in events:
            view.handle(event)
        if ending is None:
            threading.Thread(target=follow, args=(source, view), kwargs=dict(since=len(events)),
                             name="notebook_accel-attach", daemon=True).start()


def detached_jobs(root: Optional[str] = None) -> Any:
    """One's detached jobs, oldest first: a pandas DataFrame with columns id, cluster, function, state, created (a list
    of dicts without pandas). ``root``: another jobs folder than ``NOTEBOOK_ACCEL_JOBS`` / ``~/.notebook_accel/jobs``."""
    rows: List[Dict[str, Any]] = []
    for folder in job_folders(root):
        try:
            rows.append(folder.describe())
        except (OSError, ValueError):  # forgotten while listed
            continue
    for module in ELSEWHERE.values():  # e.g. the detached Ray jobs of the cluster this kernel is connected to
        for source in importlib.import_module(module).jobs():
            try:
                rows.append(source.describe())
            except Exception:  # forgotten while listed
                continue
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame(rows, columns=["id", "cluster", "function", "state", "created"])
