"""One sweep trial's folder on the shared file system: what an array task and the kernel say to each other.

The seam is two files per trial, both written by the array task's driver (``array_task``) and read by the kernel
(``array.ArraySweep``), so that nothing of ours listens on a port and a later reader could replay them:

- ``events``: every event of the trial's launch, in order, as the frames of a detached job's log (``detached.log``:
  ``length``, ``crc32``, the cloudpickled event); one ``write`` per frame to an ``O_APPEND`` file. A reader that meets a frame still
  being written (fewer bytes than its length, or a checksum that does not match yet: a network file system may show
  a write's size before its data) stops before it and reads it whole next time: no event lost, none read twice.
- ``ending``: how the launch ended (``Ending``), written whole to a temporary name and renamed, so that it is either
  absent or complete.

The kernel writes ``plan`` (the trial's cloudpickled ``LaunchPlan``) before it submits the array. Every file is the
user's only (0o600, in a 0o700 folder): a plan holds the kernel's environment.
"""
from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass
from typing import Any, List, Optional

import cloudpickle

from ...detached.ending import pickled_error
from ...detached.log import LogReader, frame
from ...errors import LaunchError, one_line

PLAN, EVENTS, ENDING, OUTPUT = "plan", "events", "ending", "slurm.out"


@dataclass(frozen=True)
class Ending:
    """How a trial's launch ended: ``status`` (a ``Status`` value), the result or the root cause (and its cause,
    the rank's traceback) cloudpickled — bytes, so that the record loads even where a result's class does not —,
    the cause's one line, and when it started and ended (the array task's clock, ``time.time()``)."""

    status: str
    started: float
    ended: float
    result: Optional[bytes] = None
    error: Optional[bytes] = None
    error_text: Optional[str] = None

    @classmethod
    def raised(cls, status: str, started: float, error: BaseException) -> "Ending":
        return cls(status, started, time.time(), error=pickled_error(error), error_text=one_line(error))

    @classmethod
    def of_launch(cls, launch: Any, started: float) -> "Ending":
        status = getattr(launch.status, "value", str(launch.status))
        if launch.error is not None:
            return cls.raised(status, started, launch.error)
        return cls(status, started, time.time(), result=cloudpickle.dumps(launch.result))

    def value(self) -> Any:
        return pickle.loads(self.result) if self.result is not None else None

    def exception(self) -> Optional[BaseException]:
        """The root cause as it was raised in the array task (its type, words, notes, and the rank's traceback as
        its ``__cause__``); a ``LaunchError`` with its words when it cannot be rebuilt here."""
        if self.error is None:
            return None
        try:
            error, cause = pickle.loads(self.error)
            error.__cause__ = cause
            return error
        except Exception:
            return LaunchError(self.error_text or f"the trial ended: {self.status}")


class TrialFolder:
    """``<sweep folder>/<trial index>``: the files above (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reader = LogReader(self.file(EVENTS))   # the kernel's, following ``events``
        self._read = 0            # how many events it gave
        self._fd: Optional[int] = None

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # ------------------------------------------------------------------------------------- the kernel's side

    def make(self, plan: Any) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        self._write_whole(PLAN, cloudpickle.dumps(plan))

    def read_events(self) -> List[Any]:
        """The events written since the last call, whole ones only (``detached.log.LogReader``)."""
        found = self._reader.read(self._read)
        self._read += len(found)
        return found

    def ending(self) -> Optional[Ending]:
        try:
            with open(self.file(ENDING), "rb") as ending:
                return pickle.loads(ending.read())
        except FileNotFoundError:
            return None

    def output_tail(self, lines: int = 15) -> str:
        """The last lines Slurm kept of the array task's own output (its driver's, not the ranks')."""
        try:
            with open(self.file(OUTPUT), errors="replace") as output:
                return "\n".join(output.read().splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------------------------------- the array task's side

    def plan(self) -> Any:
        with open(self.file(PLAN), "rb") as plan:
            return pickle.load(plan)

    def append(self, event: Any) -> None:
        if self._fd is None:
            self._fd = os.open(self.file(EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(self._fd, frame(event))

    def finish(self, ending: Ending) -> None:
        if self._fd is not None:
            os.fsync(self._fd)   # every event on the file system before the ending says there are no more
            os.close(self._fd)
            self._fd = None
        self._write_whole(ENDING, cloudpickle.dumps(ending))

    def _write_whole(self, name: str, data: bytes) -> None:
        partial = self.file(name + ".partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, data)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(partial, self.file(name))
