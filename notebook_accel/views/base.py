"""The view protocol: what every frontend (widgets, text, none) implements. Views never import torch."""
from __future__ import annotations

from typing import Protocol

from ..wire.events import RankEvent


class View(Protocol):
    """Receives every event of a launch, in arrival order, in the thread that runs the launch.

    ``handle`` gets ``LaunchStarted`` first and ``LaunchFinished`` last. ``tick`` is called a few times a
    second while the launch runs (also when no event arrived), for elapsed-time displays and coalesced
    redraws. A view must be cheap: the supervisor reads rank pipes in the same loop.
    """

    def handle(self, event: RankEvent) -> None: ...

    def tick(self) -> None: ...


class NullView:
    """display="none": shows nothing (events are still kept by the launch's job object)."""

    def handle(self, event: RankEvent) -> None:
        pass

    def tick(self) -> None:
        pass
