"""display="text" (terminals, scripts, nbconvert runs): labelled logs, throttled progress lines, a summary.

Output::

    [rank 0] loading data
    [rank 1] loading data
    [rank 0] train:  45%|####5     | 45/100 [00:01<00:01, 40.1it/s, loss=0.31]
    ...
    [rank 0] train: 100%|##########| 100/100 [00:03<00:00, 33.0it/s, loss=0.12]
    notebook_accel: train() · 2 × cpu · finished · 00:03
    [rank 0] finished

Progress lines are new lines, not carriage-return redraws: ranks interleave, and a log file or a notebook's
stream output keeps them readable. Each bar prints at most every ``progress_interval`` seconds (only when
it moved; not as it opens at 0) plus once when it closes (not a ``leave=False`` bar, which tqdm erases); the
summary does not repeat a closed bar's line, only where an open one (a failed or stopped rank's) stood. A rank that stops in pdb is said once per stop (``[rank 1] notebook_accel: at
breakpoint (train.py:12)``), not at each step; pdb's own lines and prompt follow.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Dict, Optional, TextIO

from ..wire.events import (LaunchFinished, MetricReport, OutputLine, OutputLines, PeersWaiting, ProgressUpdate,
                           PromptAnswered, PromptKind, RankEvent, RankPrompt, SessionNotice)
from .model import BarState, LaunchState, label_lines


class TextView:
    """Echoes rank output as ``[rank N] <line>``, prints per-bar progress lines, and a final summary.

    Example::

        notebook_launcher(train, num_processes=2, display="text")
    """

    progress_interval = 2.0

    def __init__(self, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None, *,
                 progress_interval: Optional[float] = None) -> None:
        self._stdout = stdout
        self._stderr = stderr
        if progress_interval is not None:
            self.progress_interval = progress_interval
        self.state = LaunchState()
        self._lock = threading.RLock()
        self._printed_at: Dict[int, float] = {}  # id(bar) -> time of its last progress line
        self._printed_n: Dict[int, float] = {}
        self._pending: Dict[int, BarState] = {}
        self._stalled: set = set()
        self._in_pdb: set = set()  # ranks whose stop in pdb was said (once per stop, not at each step)
        self._last_stream = "stdout"

    def _write(self, stream: str, text: str) -> None:
        """Write to one stream, flushing the other first when the stream changes: ipykernel shows each stream in
        the cell as it is flushed, so a rank's stderr note written before the summary showed after it."""
        if stream != self._last_stream:
            self._out(self._last_stream).flush()
            self._last_stream = stream
        self._out(stream).write(text)

    # Resolved at write time so a view made before ipykernel swapped sys.stdout still writes to the cell.
    def _out(self, stream: str) -> TextIO:
        if stream == "stderr":
            return self._stderr or sys.stderr
        return self._stdout or sys.stdout

    def handle(self, event: RankEvent) -> None:
        with self._lock:
            changed = self.state.apply(event)
            if isinstance(event, (OutputLine, OutputLines)):
                self._write(event.stream, label_lines(event.rank, event.texts))
            elif isinstance(event, ProgressUpdate) and isinstance(changed, BarState):
                self._on_bar(changed)
            elif isinstance(event, MetricReport):
                pass  # shown in the next progress line's postfix and in the summary
            elif isinstance(event, RankPrompt) and event.kind != PromptKind.INPUT:
                if event.rank not in self._in_pdb:
                    self._in_pdb.add(event.rank)
                    self._write("stdout", f"[rank {event.rank}] notebook_accel: {event.describe()}\n")
            elif isinstance(event, PromptAnswered) and event.ran_on:
                self._in_pdb.discard(event.rank)
            elif isinstance(event, (PeersWaiting, SessionNotice)):
                # the library's own notes go where a Session's and Ray's do (the cell's stderr), apart from ranks' lines
                self._write("stderr", f"notebook_accel: {event.text}\n")
            elif isinstance(event, LaunchFinished):
                self._pending.clear()
                # each closed loop's last line was printed as it closed: the summary does not repeat it
                self._write("stdout", "\n".join(self.state.summary_lines(ascii=True, closed_loops=False)) + "\n")
                for stream in ("stderr", "stdout"):
                    self._out(stream).flush()

    def tick(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._report_stalls(now)
            for key, bar in list(self._pending.items()):
                if now - self._printed_at.get(key, 0.0) >= self.progress_interval:
                    self._print_bar(bar, now)

    def _report_stalls(self, now: float) -> None:
        """One line when a rank stalls while its peers advance (once per stall, not every tick)."""
        for rank, state in self.state.ranks.items():
            stalled = self.state.stalled_for(state, now) is not None
            if stalled and rank not in self._stalled:
                self._write("stdout", f"[rank {rank}] {self.state.straggler_text(state, now)}\n")
            if stalled:
                self._stalled.add(rank)
            else:
                self._stalled.discard(rank)

    def _on_bar(self, bar: BarState) -> None:
        key = id(bar)
        now = time.monotonic()
        if bar.closed:
            if bar.update.leave:  # a leave=False bar disappears when it closes, as tqdm erases it
                self._print_bar(bar, now)
            self._pending.pop(key, None)
            self._printed_at.pop(key, None)
            self._printed_n.pop(key, None)
        elif key not in self._printed_at and not bar.update.n:
            # A bar just opened says nothing yet: its first line comes once it moved and an interval passed (an
            # epoch's inner loop shorter than that prints nothing: the demo's 10 epochs took ~60 lines).
            self._printed_at[key] = now
            self._printed_n[key] = 0
        elif now - self._printed_at.get(key, 0.0) >= self.progress_interval:
            self._print_bar(bar, now)
        else:
            self._pending[key] = bar

    def _print_bar(self, bar: BarState, now: float) -> None:
        key = id(bar)
        self._pending.pop(key, None)
        if not bar.closed and self._printed_n.get(key) == bar.update.n:
            return  # nothing moved since the last line
        self._printed_at[key] = now
        self._printed_n[key] = bar.update.n
        state = self.state.rank(bar.rank)
        extra = state.metrics_postfix() if bar is state.metrics_bar() else ""
        self._write("stdout", f"[rank {bar.rank}] {bar.meter(extra, ascii=True, ncols=None)}\n")


class OutputView:
    """``display="none"`` for a cell the user typed (``%%ranks``): the dashboard is off, but what the ranks printed
    is shown as a cell's prints are, labelled ``[rank N]`` on the stream it was written to — nothing else (no
    progress lines, no summary).

    Example::

        session = Session(num_processes=2, display="none")
        session.execute("print('hi')")     # [rank 0] hi / [rank 1] hi
    """

    def handle(self, event: RankEvent) -> None:
        if isinstance(event, (OutputLine, OutputLines)):
            (sys.stderr if event.stream == "stderr" else sys.stdout).write(label_lines(event.rank, event.texts))

    def tick(self) -> None:
        pass
