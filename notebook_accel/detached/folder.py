"""A detached job's folder: the file implementation of ``EventSink`` and ``EventSource`` (Slurm's detached jobs).

One folder per job, under :func:`jobs_root` (``~/.notebook_accel/jobs`` unless ``NOTEBOOK_ACCEL_JOBS`` names another:
it must be on a file system the compute nodes share with the kernel's machine, as a home directory is on clusters)::

    <root>/<id>/record.json   what was launched: id, cluster, function, created, the cluster's own job id
    <root>/<id>/plan.pkl      the function, its arguments and options, for the driver (written at submission)
    <root>/<id>/events.log    every event of the launch, appended as it happens (``log``)
    <root>/<id>/ending        how it ended, written once, atomically (a rename): present = the launch is over

It stays until ``forget()`` (``DetachedJob.forget``) removes it: results are kept until the user says they are done.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import secrets
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle

from ..wire.events import RankEvent
from .ending import Ending
from .log import LogReader, LogWriter

JOBS_VARIABLE = "NOTEBOOK_ACCEL_JOBS"
RECORD, PLAN, EVENTS, ENDING = "record.json", "plan.pkl", "events.log", "ending"
# cluster -> the module that asks the cluster about (and cancels) its jobs: ``state(record)``, ``cancel(record)``
CONTROLS = {"slurm": "notebook_accel.detached.slurm_control"}


def jobs_root() -> str:
    """Where job folders live: ``$NOTEBOOK_ACCEL_JOBS``, else ``~/.notebook_accel/jobs``."""
    return os.environ.get(JOBS_VARIABLE) or os.path.join(os.path.expanduser("~"), ".notebook_accel", "jobs")


def new_job_id() -> str:
    """A sortable, unique id: ``20261129-034512-3fa2``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def control_of(cluster: str) -> Any:
    return importlib.import_module(CONTROLS[cluster]) if cluster in CONTROLS else None


class JobFolder:
    """One job's folder; ``append``/``finish`` for the driver, ``read``/``cancel``/``forget``/``describe`` for
    ``attach``. ``JobFolder.create(cluster, function)`` makes a new one; ``JobFolder(path)`` opens one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._writer: Optional[LogWriter] = None
        self._reader = LogReader(os.path.join(path, EVENTS))

    @classmethod
    def create(cls, cluster: str, function: str, root: Optional[str] = None, **more: Any) -> "JobFolder":
        job_id = new_job_id()
        path = os.path.join(root or jobs_root(), job_id)
        os.makedirs(path, mode=0o700)
        folder = cls(path)
        folder.write_record(dict(id=job_id, cluster=cluster, function=function,
                                 created=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()), **more))
        return folder

    @property
    def id(self) -> str:
        return os.path.basename(self.path.rstrip(os.sep))

    # ------------------------------------------------------------------ record and plan

    def record(self) -> Dict[str, Any]:
        with open(os.path.join(self.path, RECORD)) as file:
            return json.load(file)

    def write_record(self, record: Dict[str, Any]) -> None:
        _write_atomically(os.path.join(self.path, RECORD), json.dumps(record, indent=1).encode())

    def update_record(self, **changes: Any) -> None:
        self.write_record({**self.record(), **changes})

    def write_plan(self, plan: Any) -> None:
        _write_atomically(os.path.join(self.path, PLAN), cloudpickle.dumps(plan))

    def read_plan(self) -> Any:
        with open(os.path.join(self.path, PLAN), "rb") as file:
            return pickle.load(file)

    # ------------------------------------------------------------------ EventSink

    def append(self, event: RankEvent) -> None:
        if self._writer is None:
            self._writer = LogWriter(os.path.join(self.path, EVENTS))
        self._writer.append(event)

    def finish(self, ending: Ending) -> None:
        """Write the ending once: a second one (a cancel racing the driver's own) is ignored."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not os.path.exists(os.path.join(self.path, ENDING)):
            _write_atomically(os.path.join(self.path, ENDING), pickle.dumps(ending))

    # ------------------------------------------------------------------ EventSource

    def ending(self) -> Optional[Ending]:
        try:
            with open(os.path.join(self.path, ENDING), "rb") as file:
                return pickle.load(file)
        except FileNotFoundError:
            return None

    def read(self, since: int = 0) -> Tuple[List[RankEvent], Optional[Ending]]:
        """The events from index ``since``, and the ending if written (read first: the events before it are all
        in the log by then, so a caller that sees the ending also gets the last events)."""
        ending = self.ending()
        return self._reader.read(since), ending

    def cancel(self) -> None:
        """End the job on its cluster; the ending says "stopped" (the driver writes it if it can, else this)."""
        control = control_of(self.record()["cluster"])
        if control is not None:
            control.cancel(self)

    def forget(self) -> None:
        """Delete the folder (cancelling the job first if it still runs)."""
        if self.ending() is None and self.cluster_state() is not None:
            self.cancel()
        shutil.rmtree(self.path, ignore_errors=True)

    def cluster_state(self) -> Optional[str]:
        """What the cluster says of the job while it has no ending ("pending", "running"...); None: gone."""
        control = control_of(self.record()["cluster"])
        return control.state(self) if control is not None else None

    def describe(self) -> Dict[str, Any]:
        record = self.record()
        ending = self.ending()
        state = ending.status if ending is not None else (self.cluster_state() or "lost")
        return dict(id=record["id"], cluster=record["cluster"], function=record["function"], state=state,
                    created=record["created"])


def _write_atomically(path: str, data: bytes) -> None:
    """Readers see the old file or the whole new one, never a part (a rename within the folder)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def job_folders(root: Optional[str] = None) -> List[JobFolder]:
    """Every job folder under ``root`` (``jobs_root()``), oldest first."""
    root = root or jobs_root()
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    return [JobFolder(os.path.join(root, name)) for name in names
            if os.path.exists(os.path.join(root, name, RECORD))]


def find_job(job_id: str, root: Optional[str] = None) -> JobFolder:
    path = os.path.join(root or jobs_root(), job_id)
    if not os.path.exists(os.path.join(path, RECORD)):
        known = ", ".join(folder.id for folder in job_folders(root)[-5:]) or "none"
        raise LookupError(f"no detached job {job_id!r} under {root or jobs_root()} (the latest: {known}); "
                          "notebook_accel.detached_jobs() lists them")
    return JobFolder(path)
