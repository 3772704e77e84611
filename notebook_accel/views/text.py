"""display="text": ``[rank N] line`` echo of every output line on the launcher's stdout/stderr."""
from __future__ import annotations

import sys

from ..events import LaunchFinished, OutputLine, RankEvent


class TextView:
    """Echoes rank output as ``[rank N] <line>``; stderr lines go to the launcher's stderr."""

    def __init__(self, stdout=None, stderr=None) -> None:
        self._stdout = stdout
        self._stderr = stderr

    # Resolved at write time so a view made before ipykernel swapped sys.stdout still writes to the cell.
    def _out(self, stream: str):
        if stream == "stderr":
            return self._stderr or sys.stderr
        return self._stdout or sys.stdout

    def handle(self, event: RankEvent) -> None:
        if isinstance(event, OutputLine):
            self._out(event.stream).write(f"[rank {event.rank}] {event.text}\n")
        elif isinstance(event, LaunchFinished):
            for stream in ("stdout", "stderr"):
                self._out(stream).flush()

    def tick(self) -> None:
        pass
