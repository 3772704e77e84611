"""display="widgets": the live dashboard (ipywidgets 8), fed only by events.

Layout::

    header   train() · 2 × cpu · running · 00:12
    rank 0   [desc  ████████░░░░]  45% 45/100 [00:01<00:01, 40.1it/s, loss=0.31]
    rank 1   [desc  ███████░░░░░]  41% 41/100 [00:01<00:01, 38.7it/s, loss=0.33]
    plots    one SVG line plot per reported metric, one line per rank, axes and legend; a y-scale picker per
             plot (log past two decades by default), a smoothing slider

Each rank row also shows its memory and CPU (and GPU) from ``ResourceSample`` events, a mark while it is
stalled or clearly the slowest, its finished ``leave=True`` loops as one line each, and (button "where is
each rank?") its Python stack. At the end, a last/min/max metrics table is left as plain output.

Choices, and why:

* Bars are ``FloatProgress`` widgets (desc as their description) next to an ``HTML`` with tqdm's own right
  side (``format_meter`` on the rank's ``format_dict``), so bar state is saved with the notebook.
* Throttling happens here, per bar: a bar's widgets are updated at most every ``bar_interval`` seconds
  (0.25 s → ≤ 4 refreshes, ≤ 8 widget messages a second per bar, whatever the rank's rate); a bar's
  close is applied at once, and ``LaunchFinished`` flushes everything, so the final state is exact.
* Rank output is written as plain stream output of the cell, ``[rank N] line``, coalesced: a line waits up to
  ``log_interval`` seconds for those that come with it, then they are written by rank (a ``%%ranks`` cell's
  ``[rank 0]`` first, whichever rank printed first), one write per stream. Stream output is part of the saved notebook and is
  rendered by GitHub and nbconvert, where widgets are not; an ``ipywidgets.Output`` would keep it only in
  the widget state. (The background panel instead shows a bounded tail in the widget: a background thread
  has no cell to print into.)
* The dashboard's ``text/plain`` is the launch summary; at ``LaunchFinished`` the display is updated so a
  saved notebook (GitHub, nbconvert) shows final n/total per rank and the status, not a frozen 0 %.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from html import escape
from typing import Callable, Deque, Dict, List, Optional, Tuple

import ipywidgets as widgets

from ..outcome.root_cause import is_collateral
from ..wire.events import (AttemptStarted, LaunchFinished, LaunchStarted, MetricReport, OutputLine, OutputLines,
                           PeersWaiting, ProgressUpdate, PromptAnswered, RankEvent, RankExited, RankFailed, RankPrompt,
                           RankResult, RankStacks, RankStarted, RankStatus, ResourceSample, SessionNotice)
from .model import (STATUS_COLOURS, BarState, LaunchState, RankState, clean_line, format_interval, launch_title,
                    rank_colour, resource_text)
from .plot import PLOT_WIDTH, render_line_plot

PLOT_BOX_WIDTH = PLOT_WIDTH + 8  # px: a plot and the margin to its right neighbour
MOST_PLOTS_IN_A_ROW = 3


def even_row_length(plots: int) -> int:
    """How many plots a row may hold so that the rows come out even: 4 plots make 2 + 2, not 3 + 1 (the fourth
    alone on a row of its own); a narrower cell still wraps them sooner.

    >>> [even_row_length(n) for n in range(1, 8)]
    [1, 2, 3, 2, 3, 3, 3]
    """
    rows = -(-plots // MOST_PLOTS_IN_A_ROW)
    return -(-plots // rows)

__all__ = ["WidgetView", "DashboardBox"]


class DashboardBox(widgets.VBox):
    """The dashboard's root widget; its ``text/plain`` (what GitHub/nbconvert show) is the live summary."""

    def __init__(self, summary: Callable[[], str], **kwargs) -> None:
        super().__init__(**kwargs)
        self._summary = summary

    def __repr__(self) -> str:
        return self._summary()

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None:
            data["text/plain"] = self._summary()
        return data


class _BarRow:
    """The widgets of one bar slot of one rank."""

    def __init__(self) -> None:
        # The bar has a fixed share of the row and the text the rest: every rank's bar ends at the same place,
        # whatever its postfix says (a text sized by its content pushed the bars of two ranks to two widths).
        self.bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, description="",
                                         style={"description_width": "110px"},
                                         layout=widgets.Layout(flex="0 0 45%", width="45%", min_width="200px"))
        self.text = widgets.HTML(value="", layout=widgets.Layout(flex="1 1 0", min_width="0",
                                                                 margin="0 0 0 8px"))
        self.box = widgets.HBox([self.bar, self.text], layout=widgets.Layout(align_items="center"))
        self.hidden = False
        self.sent_at = 0.0
        self.bar_id: Optional[int] = None  # the bar shown; a new one is drawn at once, not throttled

    def hide(self) -> None:
        if not self.hidden:
            self.box.layout.display = "none"
            self.hidden = True

    def show(self) -> None:
        if self.hidden:
            self.box.layout.display = None
            self.hidden = False


class _RankRow:
    """Label, bars and error text of one rank."""

    def __init__(self, rank: int) -> None:
        self.label = widgets.HTML(value="")
        self.done = widgets.HTML(value="", layout=widgets.Layout(display="none"))  # finished loops
        self.done_count = 0
        self.bars = widgets.VBox([])
        self.error = widgets.HTML(value="", layout=widgets.Layout(display="none"))
        self.stacks = widgets.HTML(value="", layout=widgets.Layout(display="none"))  # "where is each rank?"
        self.box = widgets.VBox([self.label, self.done, self.bars, self.error, self.stacks], layout=widgets.Layout(
            border_left=f"4px solid {rank_colour(rank)}", padding="0 0 0 8px", margin="3px 0"))
        self.box.add_class("notebook-accel-rank")
        self.slots: List[_BarRow] = []

    def row(self, slot: int) -> _BarRow:
        while len(self.slots) <= slot:
            row = _BarRow()
            self.slots.append(row)
            self.bars.children = tuple(r.box for r in self.slots)
        return self.slots[slot]


class WidgetView:
    """The live dashboard. ``notebook_launcher`` makes one for display="widgets" (or "auto" in a kernel).

    Example (what the launcher does)::

        view = WidgetView()
        for event in events:     # LaunchStarted first, LaunchFinished last
            view.handle(event)   # and view.tick() a few times a second
        view.widget              # the DashboardBox

    ``display=False`` builds the widget without displaying it (the panel embeds it); ``log_to="widget"``
    shows rank output in a bounded tail inside the widget instead of the cell's stream output.
    """

    bar_interval = 0.25  # s between two refreshes of one bar (2 widget messages each: ≤ 8 a second)
    header_interval = 1.0
    plot_interval = 1.0
    log_interval = 0.25
    log_tail = 400  # lines kept in the widget when log_to="widget"

    def __init__(self, *, display: bool = True, log_to: str = "stream",
                 on_finished: Optional[Callable[[LaunchFinished], None]] = None) -> None:
        if log_to not in ("stream", "widget"):
            raise ValueError(f"log_to must be 'stream' or 'widget', got {log_to!r}")
        self.state = LaunchState()
        self._display = display
        self._log_to = log_to
        self._on_finished = on_finished
        self._lock = threading.RLock()
        self._display_handle = None

        self.header = widgets.HTML(value=self._header_html())
        self.ranks_box = widgets.VBox([])
        self.plots_box = widgets.HBox([], layout=widgets.Layout(flex_flow="row wrap"))
        self.smoothing = widgets.FloatSlider(value=0.0, min=0.0, max=0.99, step=0.01, description="smoothing",
                                             continuous_update=False, readout_format=".2f",
                                             layout=widgets.Layout(width="300px"))
        self.smoothing.observe(lambda _change: self._redraw_plots(), names="value")
        self.plots_area = widgets.VBox([self.plots_box, self.smoothing], layout=widgets.Layout(display="none"))
        self._plot_scales: Dict[str, widgets.Dropdown] = {}
        self._plot_boxes: Dict[str, widgets.VBox] = {}
        self.log_box = widgets.HTML(value="", layout=widgets.Layout(display="none"))
        self.metrics_table = widgets.HTML(value="", layout=widgets.Layout(display="none"))
        # "where is each rank?": shown when ``on_dump_stacks`` is set (the launcher wires Launch.dump_stacks)
        self.on_dump_stacks: Optional[Callable[[], Dict[int, str]]] = None
        self.stacks_button = widgets.Button(description="where is each rank?", icon="search",
                                            tooltip="show every running rank's Python stack",
                                            layout=widgets.Layout(display="none", width="auto"))
        self.stacks_button.on_click(lambda _button: self.show_stacks())
        self.widget = DashboardBox(self.summary, children=[self.header, self.stacks_button, self.ranks_box,
                                                           self.plots_area, self.metrics_table, self.log_box],
                                   layout=widgets.Layout(border="1px solid var(--jp-border-color2, #ddd)",
                                                         padding="6px 8px"))
        self.widget.add_class("notebook-accel-dashboard")

        self._rank_rows: Dict[int, _RankRow] = {}
        self._plots: Dict[str, widgets.HTML] = {}
        self._dirty_bars: Dict[Tuple[int, int], BarState] = {}
        self._dirty_plots: Dict[str, float] = {}  # metrics with new points since their last drawing
        self._plot_drawn: Dict[str, float] = {}
        self._header_at = 0.0
        self._header_status = ""
        self._log_buffer: List[Tuple[int, str, str]] = []  # (rank, stream, labelled line), as they came
        self._log_lines: Deque[str] = deque(maxlen=self.log_tail)
        self._log_total = 0
        self._log_since = 0.0  # when the oldest line of the buffer came
        self._dirty_labels: set = set()          # ranks whose label (resources, stall mark) needs a redraw
        self._straggler_marks: Dict[int, str] = {}
        self._stragglers_at = 0.0
        self._label_drawn: Dict[int, float] = {}

    # ------------------------------------------------------------------------------------ View protocol
    def handle(self, event: RankEvent) -> None:
        with self._lock:
            changed = self.state.apply(event)
            now = time.monotonic()
            if isinstance(event, ProgressUpdate):
                self._on_bar(changed, now)  # type: ignore[arg-type]
            elif isinstance(event, (OutputLine, OutputLines)):  # a line each: the log counts and bounds lines
                if not self._log_buffer:
                    self._log_since = now
                self._log_buffer.extend((event.rank, event.stream, f"[rank {event.rank}] {clean_line(text)}\n")
                                        for text in event.texts)
            elif isinstance(event, MetricReport):
                self._on_metrics(event, changed)  # type: ignore[arg-type]
            elif isinstance(event, ResourceSample):
                self._dirty_labels.add(event.rank)
            elif isinstance(event, RankStacks):
                self._show_stack(event.rank, event.text, time.strftime("%H:%M:%S"))
            elif isinstance(event, LaunchStarted):
                self._on_started()
            elif isinstance(event, (PeersWaiting, SessionNotice)):
                self._draw_header()
            elif isinstance(event, AttemptStarted):  # the world runs again: fresh rank rows, same plots
                self._rank_rows.clear()
                self._dirty_bars.clear()
                for rank in sorted(self.state.ranks):
                    self._rank_row(rank)
                self._draw_header()
            elif isinstance(event, (RankPrompt, PromptAnswered)):
                if isinstance(event, RankPrompt):  # pdb's lines above the input box that asks
                    self._flush_logs(now)
                self._draw_rank_label(self.state.rank(event.rank))
            elif isinstance(event, (RankStarted, RankResult, RankFailed, RankExited)):
                self._draw_rank_label(self.state.rank(event.rank))
                if isinstance(event, RankFailed):
                    self._draw_failure(self.state.rank(event.rank))
            elif isinstance(event, LaunchFinished):
                self._on_finished_event(event)
                return
            self._flush(now)

    def tick(self) -> None:
        with self._lock:
            self._flush(time.monotonic())

    def show_stacks(self) -> Dict[int, str]:
        """Ask ``on_dump_stacks`` where each rank is and show each stack in its rank's row.

        The button calls this; it only responds while the kernel is free to handle widget messages (a launch
        from ``launch_panel`` or ``start_launch``): a cell blocked in ``notebook_launcher`` handles the click
        when it ends. Returns {rank: stack text}.
        """
        callback = self.on_dump_stacks
        if callback is None:
            return {}
        try:
            stacks = dict(callback())
        except Exception as error:  # the ranks may be gone between the click and the dump
            stacks = {rank: f"(could not get the stack: {type(error).__name__}: {error})"
                      for rank in self.state.ranks}
        when = time.strftime("%H:%M:%S")
        with self._lock:
            for rank, text in sorted(stacks.items()):
                self._show_stack(rank, text, when)
        return stacks

    def _show_stack(self, rank: int, text: str, when: str) -> None:
        row = self._rank_rows.get(rank)
        if row is None:
            return
        row.stacks.value = (f'<details open><summary style="font-size:11px">where rank {rank} was at '
                            f'{when}</summary><pre style="font-size:11px;max-height:260px;overflow:auto">'
                            f"{escape(text)}</pre></details>")
        row.stacks.layout.display = None

    # ------------------------------------------------------------------------------------------- summary
    def summary(self) -> str:
        """The launch as text: header, per rank its bars (final n/total) and status, then the error."""
        with self._lock:  # the panel's launch thread may be applying an event right now
            return "\n".join(self.state.summary_lines(ascii=False))

    @property
    def log_lines(self) -> List[str]:
        """The last ``log_tail`` output lines (labelled ``[rank N]``)."""
        return list(self._log_lines)

    # ------------------------------------------------------------------------------------------ handlers
    def _on_started(self) -> None:
        for rank in sorted(self.state.ranks):
            self._rank_row(rank)
        self._draw_header()
        if self.on_dump_stacks is not None:
            self.stacks_button.layout.display = None
        if self._display:
            from IPython.display import display

            self._display_handle = display(self.widget, display_id=True)

    def _on_bar(self, bar: BarState, now: float) -> None:
        key = (bar.rank, bar.bar_id)
        rank_row = self._rank_row(bar.rank)
        state = self.state.rank(bar.rank)
        if rank_row.done_count != state.finished_loop_count:
            self._draw_finished_loops(rank_row, state)
        row = rank_row.row(bar.slot)
        if bar.closed or row.bar_id != bar.bar_id or now - row.sent_at >= self.bar_interval:
            self._dirty_bars.pop(key, None)
            self._draw_bar(bar, row, now)
        else:
            self._dirty_bars[key] = bar

    def _on_metrics(self, event: MetricReport, names: List[str]) -> None:
        for name in names:
            self._dirty_plots.setdefault(name, 0.0)
        bar = self.state.rank(event.rank).metrics_bar()
        if bar is not None and not bar.closed:  # the bar's postfix shows the latest values
            self._dirty_bars.setdefault((bar.rank, bar.bar_id), bar)

    def _on_finished_event(self, event: LaunchFinished) -> None:
        now = time.monotonic()
        for state in self.state.ranks.values():
            for bar in state.visible_bars():
                self._draw_bar(bar, self._rank_row(state.rank).row(bar.slot), now)
            self._draw_rank_label(state)
            if state.failure is not None or state.root_cause:
                self._draw_failure(state)
        self._dirty_bars.clear()
        for name in list(self._dirty_plots) + list(self._plots):
            self._draw_plot(name, now)
        self._dirty_plots.clear()
        self._flush_logs(now)
        self._draw_header()
        self.stacks_button.layout.display = "none"
        self._show_metrics_table()
        if self._display_handle is not None:
            # Re-publish so the saved text/plain becomes the final summary (the widget itself is unchanged).
            try:
                self._display_handle.update(self.widget)
            except Exception:
                pass
        if self._on_finished is not None:
            self._on_finished(event)

    # ------------------------------------------------------------------------------------------- drawing
    def _flush(self, now: float) -> None:
        for key, bar in list(self._dirty_bars.items()):
            row = self._rank_row(bar.rank).row(bar.slot)
            if now - row.sent_at >= self.bar_interval:
                del self._dirty_bars[key]
                self._draw_bar(bar, row, now)
        for name in list(self._dirty_plots):
            if now - self._plot_drawn.get(name, 0.0) >= self.plot_interval_now():
                del self._dirty_plots[name]
                self._draw_plot(name, now)
        if now - self._stragglers_at >= 0.5:  # stall / slowest marks change with time, not only with events
            self._stragglers_at = now
            for rank, state in self.state.ranks.items():
                mark = self.state.straggler_text(state, now)
                if mark != self._straggler_marks.get(rank, ""):
                    self._straggler_marks[rank] = mark
                    self._dirty_labels.add(rank)
        if self._dirty_labels:
            # Each label at most every label_interval() s: ≤ 4 label messages a second whatever the world size.
            interval = self.label_interval()
            for rank in sorted(self._dirty_labels):
                if now - self._label_drawn.get(rank, 0.0) >= interval:
                    self._dirty_labels.discard(rank)
                    self._draw_rank_label(self.state.rank(rank))
        if now - self._header_at >= self.header_interval or self._header_status != self.state.status:
            self._draw_header()
        if self._log_buffer and now - self._log_since >= self.log_interval:
            self._flush_logs(now)

    def _show_metrics_table(self) -> None:
        """The final last/min/max table: in the widget, and (in a cell) as a plain HTML + text output, which
        a saved notebook keeps where widgets do not render (GitHub, nbconvert)."""
        summary = self.state.metric_summary
        if not summary:
            return
        table = summary.html()
        if self._display:  # in a cell: one plain output (shown live and kept in the saved notebook)
            from IPython.display import display

            display({"text/html": table, "text/plain": "metrics:\n" + summary.text()}, raw=True)
            return
        self.metrics_table.value = (f'<details open><summary style="font-size:12px"><b>metrics</b> '
                                    f"(last / min / max per rank)</summary>{table}</details>")
        self.metrics_table.layout.display = None

    @staticmethod
    def _draw_finished_loops(row: _RankRow, state: RankState) -> None:
        """Finished leave=True loops, one compact line each (a new loop took their slot)."""
        row.done_count = state.finished_loop_count
        earlier = state.finished_loop_count - len(state.finished_loops)
        lines = ([f"… {earlier} earlier finished loop{'s' if earlier > 1 else ''}"] if earlier else [])
        lines += [f"✓ {line}" for line in state.finished_loops]
        row.done.value = ('<div class="notebook-accel-finished" style="font-family:monospace;font-size:11px;'
                          'line-height:1.35;white-space:pre;opacity:0.8">' + escape("\n".join(lines)) + "</div>")
        row.done.layout.display = None

    def label_interval(self) -> float:
        """Seconds between two redraws of one rank's label: 1 s up to 4 ranks, then longer (8 ranks: 2 s)."""
        return max(1.0, self.state.world_size / 4.0)

    def _rank_row(self, rank: int) -> _RankRow:
        row = self._rank_rows.get(rank)
        if row is None:
            row = self._rank_rows[rank] = _RankRow(rank)
            self._draw_rank_label(self.state.rank(rank))
            self.ranks_box.children = tuple(self._rank_rows[r].box for r in sorted(self._rank_rows))
        return row

    def _draw_bar(self, bar: BarState, row: _BarRow, now: float) -> None:
        row.sent_at = now
        row.bar_id = bar.bar_id
        state = self.state.rank(bar.rank)
        if bar.slot >= len(state.slots) or state.slots[bar.slot] != bar.bar_id:
            if bar.slot < len(state.slots) and state.slots[bar.slot] is None:
                row.hide()  # leave=False bar closed
            return
        row.show()
        update = bar.update
        extra = state.metrics_postfix() if bar is state.metrics_bar() else ""
        with row.bar.hold_sync():
            if update.total:
                row.bar.max = float(update.total)
                row.bar.value = float(min(update.n, update.total))
            else:  # unknown total: a full "info" bar, as tqdm.notebook shows it
                row.bar.max = 1.0
                row.bar.value = 1.0
            row.bar.description = bar.desc
            row.bar.bar_style = self._bar_style(bar, state)
        row.text.value = ('<span style="font-family:monospace;white-space:pre-wrap">'
                          f"{escape(bar.right_text(extra))}</span>")

    def _bar_style(self, bar: BarState, state: RankState) -> str:
        if not bar.update.total:
            return "danger" if state.status == RankStatus.FAILED else "info"
        if bar.complete:
            return "success"
        if state.status == RankStatus.FAILED or state.root_cause:
            return "danger"
        if bar.closed or state.status == RankStatus.STOPPED:
            return "warning"
        return ""

    def _draw_header(self) -> None:
        self._header_at = time.monotonic()
        self._header_status = self.state.status
        self.header.value = self._header_html()

    def _header_html(self) -> str:
        state = self.state
        colour = STATUS_COLOURS.get(state.status, "inherit")
        started = state.started
        items = [
            ("device", state.device if started else "…"),
            ("world size", str(state.world_size) if started else "…"),
            ("status", f'<span style="{readable(colour)}">{escape(state.status)}</span>'),
            ("elapsed", format_interval(state.elapsed())),
        ]
        if started is not None and started.mixed_precision not in ("", "no"):
            items.append(("precision", escape(started.mixed_precision)))
        for name, value in state.place():  # ("node rank", "1 of 2"), ("attempt", "2/3")
            items.append((name, escape(value)))
        if state.peers_waiting is not None and state.finished is None:  # said once, in the header, until the end
            items.append(("waiting", f'<span class="na-peers-waiting">{escape(state.peers_waiting.text)}</span>'))
        for notice in state.session_notices:  # said plainly: "ranks restarted: state lost (...)"
            items.append(("session", f'<span class="na-session-notice">{escape(notice)}</span>'))
        if state.attempt is not None and state.attempt.previous_errors:
            items.append(("earlier attempts", escape(" | ".join(state.attempt.previous_errors))))
        totals = state.resource_totals()
        if totals:
            items.append(("resources", escape(totals)))
        cells = "".join(f'<span style="margin-right:18px">{name}: <b class="na-{name.replace(" ", "-")}">'
                        f"{value}</b></span>" for name, value in items)
        title = escape(launch_title(started.function_name)) if started is not None and started.function_name else ""
        return (f'<div class="notebook-accel-header" style="font-size:13px;padding:2px 0 4px 0">'
                f'<b>notebook_accel</b> <span style="color:var(--jp-ui-font-color2, #666);margin-right:18px">'
                f"{title}</span>{cells}</div>")

    def _draw_rank_label(self, state: RankState) -> None:
        row = self._rank_rows.get(state.rank)
        if row is None:
            return
        self._label_drawn[state.rank] = time.monotonic()
        colour = readable(rank_colour(state.rank))
        status_colour = STATUS_COLOURS.get(state.status, "inherit")
        pid = (f" · {escape(state.host)}" if state.host else "") + (
            f" via {escape(state.network)}" if state.network else "") + (f" · pid {state.pid}" if state.pid else "")
        mark = ""
        straggler = self._straggler_marks.get(state.rank, "") if self.state.finished is None else ""
        if straggler:
            mark = f' <b class="notebook-accel-straggler" style="color:#e67e22">⚠ {escape(straggler)}</b>'
        if state.root_cause:
            mark = ' <b style="color:#d62728">✖ root cause</b>'
            row.box.layout.border_left = "4px solid #d62728"
            row.box.layout.background_color = "rgba(214, 39, 40, 0.10)"  # a tint: readable in light and dark
        resources = resource_text(state.resources, final=self.state.finished is not None)
        resources = (f' · <span class="notebook-accel-resources">{escape(resources)}</span>'
                     if resources else "")
        row.label.value = (f'<span class="notebook-accel-rank-label" style="font-size:12px">'
                           f'<b style="{colour}">rank {state.rank}</b>{pid} · '
                           f'<span style="{readable(status_colour)}">'
                           f'{escape(self.state.rank_status_text(state, mark_root=False))}'
                           f"</span>{resources}{mark}</span>")

    def _draw_failure(self, state: RankState) -> None:
        row = self._rank_rows.get(state.rank)
        if row is None:
            return
        failure = state.failure
        finished = self.state.finished
        full = ""
        if failure is not None:
            headline = failure.exc_type.rsplit('.', 1)[-1] + (f": {failure.message}" if failure.message else "")
            traceback = failure.traceback
            if failure.full_traceback and failure.full_traceback != failure.traceback:
                full = (f'<details><summary style="font-size:11px;opacity:0.75">full traceback, with '
                        f'notebook_accel\'s own frames (for a bug report)</summary><pre style="font-size:11px;'
                        f'max-height:240px;overflow:auto">{escape(failure.full_traceback)}</pre></details>')
        elif finished is not None and state.root_cause:
            headline, traceback = finished.error or "failed", finished.traceback or ""
        else:
            return
        if state.root_cause or (finished is None):
            body = (f'<details open><summary style="color:#d62728"><b>{escape(headline)}</b></summary>'
                    f'<pre style="font-size:11px;line-height:1.3;max-height:320px;overflow:auto;'
                    f'background:rgba(214,39,40,0.06);padding:4px">{escape(traceback)}</pre>{full}</details>')
        else:  # another rank's failure: one line, folded traceback
            # "collateral" only when it is a reaction to a peer's failure (gloo's "Connection closed by peer");
            # a rank that raised on its own, only later than the root cause, is said to be just that.
            why = "collateral" if is_collateral(failure) else "not the root cause"
            body = (f'<details><summary style="color:#d62728">{escape(headline)} ({why})</summary>'
                    f'<pre style="font-size:11px;max-height:200px;overflow:auto">{escape(traceback)}</pre>'
                    f"</details>")
        row.error.value = body
        row.error.layout.display = None
        self._draw_rank_label(state)

    def _draw_plot(self, name: str, now: float) -> None:
        self._plot_drawn[name] = now
        series = self.state.series.get(name)
        if not series:
            return
        scale = self._plot_scales[name].value if name in self._plot_scales else "auto"
        svg = render_line_plot(name, {rank: s.view() for rank, s in series.items()},
                               x_label="time (s)" if self.state.x_is_time.get(name) else "step",
                               log_y=None if scale == "auto" else scale == "log",
                               smoothing=float(self.smoothing.value))
        plot = self._plots.get(name)
        if plot is None:
            plot = self._plots[name] = widgets.HTML(value=svg)
            plot.add_class("notebook-accel-plot")
            picker = self._plot_scales[name] = widgets.Dropdown(
                options=[("y: auto", "auto"), ("y: linear", "linear"), ("y: log", "log")], value="auto",
                tooltip="y axis: auto is log when the values span more than two decades",
                layout=widgets.Layout(width="110px"))
            picker.observe(lambda _change, name=name: self._redraw_plot(name), names="value")
            box = widgets.VBox([plot, picker], layout=widgets.Layout(margin=f"4px {PLOT_BOX_WIDTH - PLOT_WIDTH}px 0 0"))
            self._plot_boxes[name] = box
            self.plots_box.children = tuple(self._plot_boxes[n] for n in self._plot_boxes)
            self.plots_box.layout.max_width = f"{even_row_length(len(self._plot_boxes)) * PLOT_BOX_WIDTH}px"
            self.plots_area.layout.display = None
        else:
            plot.value = svg

    def _redraw_plot(self, name: str) -> None:
        """A control changed (scale, smoothing): redraw now, whatever the throttle says."""
        with self._lock:
            self._draw_plot(name, time.monotonic())

    def _redraw_plots(self) -> None:
        with self._lock:
            for name in list(self._plots):
                self._draw_plot(name, time.monotonic())

    def plot_interval_now(self) -> float:
        """Seconds between two redraws of one plot: 1 s up to 3 plots, then longer (≤ 3 plot messages a second)."""
        return max(self.plot_interval, len(self._plots) / 3.0)

    def _flush_logs(self, now: float) -> None:
        # Lines that came within one interval are one moment to a reader: shown by rank (each rank's in its order),
        # so a %%ranks cell's [rank 0] comes before [rank 1] whichever rank printed first.
        buffer = [(stream, text) for _, stream, text in sorted(self._log_buffer, key=lambda line: line[0])]
        self._log_buffer = []
        if not buffer:
            return
        self._log_total += len(buffer)
        if self._log_to == "widget":
            self._log_lines.extend(text.rstrip("\n") for _, text in buffer)
            hidden = self._log_total - len(self._log_lines)
            note = f"… {hidden} earlier lines not shown\n" if hidden else ""
            self.log_box.value = ('<pre style="font-size:11px;max-height:240px;overflow:auto;margin:4px 0">'
                                  f"{escape(note + chr(10).join(self._log_lines))}</pre>")
            self.log_box.layout.display = None
            return
        self._log_lines.extend(text.rstrip("\n") for _, text in buffer)
        # One write per run of same-stream lines: a rank printing 20k lines sends a handful of messages.
        run_stream, run = buffer[0][0], []
        for stream, text in buffer:
            if stream != run_stream:
                _write(run_stream, "".join(run))
                run_stream, run = stream, []
            run.append(text)
        _write(run_stream, "".join(run))


def readable(colour: str) -> str:
    """CSS for text in ``colour`` that stays readable on light and dark themes: the colour mixed with the
    theme's font colour (darker on white, lighter on black), plain ``colour`` where color-mix is unknown."""
    if colour == "inherit":
        return "color:inherit"
    return f"color:{colour};color:color-mix(in srgb, {colour} 75%, var(--jp-ui-font-color1, #000))"


def _write(stream: str, text: str) -> None:
    # Resolved at write time: ipykernel swaps sys.stdout per cell.
    target = sys.stderr if stream == "stderr" else sys.stdout
    target.write(text)
    target.flush()

