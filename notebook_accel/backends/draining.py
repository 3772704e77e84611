"""When to stop reading a rank's pipe after the rank is gone: never while it still holds what the rank wrote.

A rank that ended, or whose process group was killed, has closed its ends of its pipes: what it wrote sits
in them, and is read to EOF however long the view takes to show it (a slow notebook front end, a remote
terminal). Only a process that outlived the rank — one that left its process group (``setsid``, a daemon) —
can keep a pipe open. Once the bytes that were in the pipe when the rank ended are read, such a pipe is given
up when it has been silent for ``QUIET_SECONDS``, or after ``HELD_SECONDS`` if that process keeps writing;
``held_open_note`` is the line that says so in the rank's output.

A warm rank (a session's) lives on after each run, and its pipes with it: a run reads what the rank wrote before
it said it was done, however long that takes, and then stops — but a process the rank left outside its group
that keeps writing holds the run only ``HELD_SECONDS`` after the rank's own bytes were read
(``still_writing_note``); the pipe stays open, and the next run reads on.
"""
from __future__ import annotations

from typing import Optional

from ..wire.fds import pending_bytes

QUIET_SECONDS = 1.0   # a pipe held open by a process the rank left behind, silent this long: stop waiting
HELD_SECONDS = 5.0    # ... or still writing this long after the rank's own output was read


class PipeDrain:
    """One pipe whose writer (the rank) is gone: count what it still owes, and say when to stop waiting for EOF.

    Example::

        drain = PipeDrain(fd, time.monotonic())       # the rank's process is gone
        drain.got(len(chunk), time.monotonic())        # after every read
        why = drain.give_up(ready=False, now=time.monotonic())  # "silent for 1 s", or None: keep reading
    """

    def __init__(self, fd: int, now: float) -> None:
        self.owed = pending_bytes(fd)                       # what the rank wrote that is not read yet
        self.heard_at = now                                  # the last data, or the rank's end
        self.held_since: Optional[float] = now if self.owed <= 0 else None  # the rank's bytes all read

    def got(self, count: int, now: float) -> None:
        """``count`` bytes were read from the pipe (0: none, or EOF)."""
        if count:
            self.heard_at = now
            self.owed -= count
        if self.owed <= 0 and self.held_since is None:
            self.held_since = now

    def give_up(self, ready: bool, now: float) -> Optional[str]:
        """Why to stop reading now (``ready``: the pipe has data or EOF to read), or None to go on."""
        if self.held_since is None:  # the rank's own output is not all read yet
            return None
        if not ready and now - self.heard_at >= QUIET_SECONDS:
            return f"silent for {QUIET_SECONDS:g} s"
        if now - self.held_since >= HELD_SECONDS:
            return f"still writing {HELD_SECONDS:g} s after the rank's own output was read"
        return None


def held_open_note(rank: int, stream: str, why: str) -> str:
    """The line a rank's output gets when its ``stream`` pipe was given up (``why`` from ``give_up``)."""
    return (f"notebook_accel: a process started by rank {rank} outlived it (it left the rank's process group, "
            f"e.g. with setsid) and holds its {stream} open; stopped reading it ({why}): "
            f"lines that process writes from now on may be missing")


def still_writing_note(rank: int, stream: str, why: str) -> str:
    """The line a warm rank's output gets when a run stopped reading its ``stream`` pipe (``why`` from
    ``give_up``) that a process it left is still writing to; the rank lives on, and so does the pipe."""
    return (f"notebook_accel: a process started by rank {rank} outside its process group (e.g. with setsid) keeps "
            f"writing to its {stream}; the run ended without reading the rest ({why}): those lines may show with "
            f"the next run")
