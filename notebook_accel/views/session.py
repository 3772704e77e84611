"""The session's own row: its ranks, idle or busy, memory (and GPU) per rank, runs and restarts.

Shown once, in the cell that made the ``Session`` (each run's bars, plots and output go under the run's own cell,
as a launch's do). In a notebook it is a widget updated in place, whose ``text/plain`` (what a saved notebook
shows on GitHub or after nbconvert, where widgets do not render) is the summary line, published again whenever the
session is idle after a change; elsewhere a line (on stdout, as the runs' text) when the session is ready, restarted or
closed.
"""
from __future__ import annotations

import html
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..formatting import count, format_bytes
from ..wire.events import ResourceSample, SessionStatus
from . import enable_colab_widgets, in_notebook_kernel


@dataclass
class SessionSummary:
    """What the row shows (the session fills it in; plain data, so the view stays torch-free)."""

    num_processes: int
    device: str
    start_method: str
    status: SessionStatus
    runs: int
    restarts: int
    samples: Dict[int, ResourceSample] = field(default_factory=dict)
    notice: Optional[str] = None

    def rank_figures(self) -> List[str]:
        figures = []
        for rank in range(self.num_processes):
            sample = self.samples.get(rank)
            text = f"rank {rank}: {format_bytes(sample.rss) if sample and sample.rss else '?'}"
            if sample is not None and sample.device_used is not None:
                text += f", GPU {format_bytes(sample.device_used)}"
            figures.append(text)
        return figures

    def line(self) -> str:
        return (f"notebook_accel session: {count(self.num_processes, 'rank')}, {self.device}, {self.start_method}, "
                f"{self.status}, {count(self.runs, 'run')}, {count(self.restarts, 'restart')}; "
                + "; ".join(self.rank_figures()) + (f" — {self.notice}" if self.notice else ""))


def current_cell() -> Optional[str]:
    """The id of the kernel's request running now (the cell being executed), or None outside a kernel."""
    try:
        from IPython import get_ipython

        return get_ipython().kernel.get_parent()["header"]["msg_id"]
    except Exception:  # no IPython, no kernel (a terminal), no request
        return None


class SessionView:
    """``display`` as the launcher takes it: "auto"/"widgets" a widget in a notebook, "text" lines, "none"."""

    def __init__(self, display: str) -> None:
        self.mode = "none" if display == "none" else "text"
        self._line = "notebook_accel session: starting"
        if display in ("auto", "widgets") and in_notebook_kernel() and enable_colab_widgets():
            try:
                import ipywidgets
                from IPython.display import display as show

                from .widgets import DashboardBox

                self.widget = ipywidgets.HTML()
                self.box = DashboardBox(lambda: self._line, children=[self.widget])
                self._handle = show(self.box, display_id=True)
                self._shown_in = current_cell()
                self.mode = "widgets"
            except ImportError:
                pass
        self._said: Optional[tuple] = None
        self._shown_in: Optional[str] = getattr(self, "_shown_in", None)  # the cell whose output holds the row

    def update(self, summary: SessionSummary) -> None:
        if self.mode == "widgets":
            self.widget.value = self.html(summary)
            self._line = summary.line()
            # The saved text follows too, once per change a reader cares about (not on every memory sample).
            key = (summary.status, summary.runs, summary.restarts, summary.notice)
            if summary.status != SessionStatus.BUSY and key != self._said:
                self._said = key
                try:
                    self._handle.update(self.box)
                except Exception:  # a front end gone: the widget itself is up to date
                    pass
        elif self.mode == "text":
            # A line when something a reader cares about changed: ready, restarted, closed (not every run).
            key = (summary.status in (SessionStatus.IDLE, SessionStatus.BUSY), summary.restarts,
                   summary.status == SessionStatus.CLOSED)
            if key != self._said:
                self._said = key
                # On stdout, where the runs' text goes: a notebook shows the two streams apart, and stderr's text
                # (tinted as an error) arrived after a run's output printed later in the same cell.
                print(summary.line(), file=sys.stdout, flush=True)

    def show_again(self) -> bool:
        """Show the row once more in the current cell (the same widget, the same display id: every copy stays live,
        and so does the saved text of each), unless the current cell is the one that showed it; False when the row
        is no widget."""
        if self.mode != "widgets":
            return False
        if self._shown_in is not None and self._shown_in == current_cell():
            return True  # `session` ending the cell that made it: the row is right above, not twice in one cell
        from IPython.display import display as show

        show(self.box, display_id=self._handle.display_id)
        return True

    @staticmethod
    def html(summary: SessionSummary) -> str:
        items = [("ranks", str(summary.num_processes)), ("device", summary.device),
                 ("start method", summary.start_method), ("status", str(summary.status)),
                 ("runs", str(summary.runs)), ("restarts", str(summary.restarts)),
                 ("memory", " · ".join(summary.rank_figures()))]
        if summary.notice:
            items.append(("last", summary.notice))
        cells = "".join(f'<span style="margin-right:18px">{name}: <b class="na-session-{name.replace(" ", "-")}">'
                        f"{html.escape(value)}</b></span>" for name, value in items)
        return (f'<div class="notebook-accel-session" style="font-size:13px;padding:2px 0">'
                f"<b>notebook_accel session</b> {cells}</div>")
