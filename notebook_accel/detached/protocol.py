"""What a detached launch is made of, as two protocols: where its events go while it runs (``EventSink``), and where a
later kernel reads them back (``EventSource``). A cluster keeps them where it keeps files: Slurm in a job folder on
the shared file system (``folder.JobFolder`` is both), Ray in its own stores."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Tuple

from ..wire.events import RankEvent
from .ending import Ending


class EventSink(Protocol):
    """Written by the driver that runs a detached launch: every event in order, then once how the launch ended."""

    def append(self, event: RankEvent) -> None: ...

    def finish(self, ending: Ending) -> None: ...


class EventSource(Protocol):
    """Read by ``attach``: the events from index ``since`` (replay from 0, then follow), and the ending once written.

    ``read`` never returns a half-written event, and never the same one twice for increasing ``since``.
    ``describe`` is one row of ``detached_jobs()``: ``{"id", "cluster", "function", "state", "created"}``.
    """

    def read(self, since: int) -> Tuple[List[RankEvent], Optional[Ending]]: ...

    def cancel(self) -> None: ...

    def forget(self) -> None: ...

    def describe(self) -> Dict[str, Any]: ...
