"""The recording view: a ``View`` that writes every event of a launch to an ``EventSink`` (a detached launch's log),
and, once the launch ended, how it ended (``finish``)."""
from __future__ import annotations

from typing import Any

from ..wire.events import RankEvent
from .ending import Ending
from .protocol import EventSink


class RecordingView:
    """Every event to ``sink``, in the order the launch delivers them (``LaunchStarted`` first, ``LaunchFinished``
    last); ``finish(launch, elapsed)`` writes the ending. ``also``: a view shown at the same time (a driver's log)."""

    def __init__(self, sink: EventSink, also: Any = None) -> None:
        self.sink = sink
        self.also = also

    def handle(self, event: RankEvent) -> None:
        self.sink.append(event)
        if self.also is not None:
            self.also.handle(event)

    def tick(self) -> None:
        if self.also is not None:
            self.also.tick()

    def finish(self, launch: Any, elapsed: float) -> Ending:
        """Write how ``launch`` ended (after its ``run``/``wait``); returned."""
        ending = Ending.of_launch(launch, elapsed)
        self.sink.finish(ending)
        return ending
