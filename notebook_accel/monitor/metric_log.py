"""The run's metrics, back in the kernel: every reported value as rows, and a last/min/max summary.

``MetricLog`` keeps every ``report`` call of every rank (``Launch.metrics``); ``MetricSummary`` keeps only
last/min/max per metric per rank (what the dashboard's final table shows, O(metrics × ranks) memory).
Neither imports torch or ipywidgets; pandas only when ``Launch.metrics`` is read.

Example::

    job = start_launch(train, num_processes=2, display="none"); job.wait()
    job.metrics                       # a DataFrame: rank, step, time, name, value (pandas needed)
    job.metric_log.rows()             # the same rows as named tuples, without pandas
    job.metrics.pivot_table(index="step", columns="rank", values="value")
"""
from __future__ import annotations

import math
import threading
from html import escape
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..formatting import format_value
from ..wire.events import MetricReport

COLUMNS = ("rank", "step", "time", "name", "value")
PANDAS_HINT = ("Launch.metrics is a pandas DataFrame and pandas is not installed: pip install pandas, or "
               "pip install \"notebook_accel[notebooks]\" (what every notebook uses); without it, "
               "Launch.metric_log.rows() gives the same rows as named tuples (rank, step, time, name, value)")


class MetricRow(NamedTuple):
    """One reported value. ``step`` is None when ``report`` was called without one; ``time`` is the
    rank's wall-clock time (``time.time()``) of the call."""

    rank: int
    step: Optional[int]
    time: float
    name: str
    value: float


class MetricLog:
    """Every value reported in a launch, in arrival order (thread-safe: the panel reads while a launch runs)."""

    def __init__(self) -> None:
        self._rows: List[MetricRow] = []
        self._lock = threading.Lock()

    def add(self, event: MetricReport) -> None:
        rows = [MetricRow(event.rank, step, when, name, float(value))
                for step, when, _seq, values in event.calls() for name, value in values.items()]
        with self._lock:
            self._rows.extend(rows)

    def rows(self) -> List[MetricRow]:
        with self._lock:
            return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def table(self) -> Any:
        """A pandas DataFrame with ``COLUMNS``; without pandas an ``ImportError`` that says what to install (one
        type whatever is installed: a list in its place failed later, at the notebook's ``.groupby``)."""
        rows = self.rows()
        try:
            import pandas
        except ImportError:
            raise ImportError(PANDAS_HINT) from None
        frame = pandas.DataFrame.from_records(rows, columns=list(COLUMNS))
        frame["step"] = frame["step"].astype("Int64")  # nullable: a report without step has <NA>
        return frame


class _Stats:
    __slots__ = ("last", "low", "high", "count")

    def __init__(self, value: float) -> None:
        self.last = self.low = self.high = value
        self.count = 1

    def add(self, value: float) -> None:
        self.last = value
        self.count += 1
        if value < self.low or math.isnan(self.low):
            self.low = value
        if value > self.high or math.isnan(self.high):
            self.high = value


class MetricSummary:
    """last / min / max / count per (metric, rank), updated from ``MetricReport`` events."""

    def __init__(self) -> None:
        self.stats: Dict[Tuple[str, int], _Stats] = {}

    def add(self, event: MetricReport) -> None:
        for _step, _when, _seq, values in event.calls():
            for name, value in values.items():
                key = (name, event.rank)
                value = float(value)
                if key in self.stats:
                    self.stats[key].add(value)
                else:
                    self.stats[key] = _Stats(value)

    def __bool__(self) -> bool:
        return bool(self.stats)

    def table_rows(self) -> List[Tuple[str, str, str, str, str, str]]:
        """(metric, rank, last, min, max, count) as text, sorted by metric then rank."""

        return [(name, str(rank), format_value(s.last), format_value(s.low), format_value(s.high), str(s.count))
                for (name, rank), s in sorted(self.stats.items())]

    def text(self) -> str:
        """A plain-text table (what a saved notebook shows on GitHub and in nbconvert)."""
        header = ("metric", "rank", "last", "min", "max", "reports")
        rows = [header] + self.table_rows()
        widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
        lines = ["  ".join(cell.ljust(width) if column < 2 else cell.rjust(width)
                           for column, (cell, width) in enumerate(zip(row, widths))).rstrip()
                 for row in rows]
        return "\n".join(lines)

    def html(self) -> str:
        """The same table as HTML (rendered by GitHub, nbviewer, JupyterLab; inherits the theme's colours)."""
        # Room between the columns and numbers right-aligned on their digits: a front end's default table style
        # (JupyterLab's, nbconvert's) ran "0.9394   0.8485" into one cramped block.
        def cell(tag: str, column: int, text: str) -> str:
            align = "left" if column < 2 else "right"
            return (f'<{tag} style="padding:2px 14px 2px 0;text-align:{align};'
                    f'font-variant-numeric:tabular-nums">{escape(text)}</{tag}>')

        head = "".join(cell("th", column, text)
                       for column, text in enumerate(("metric", "rank", "last", "min", "max", "reports")))
        body = "".join("<tr>" + "".join(cell("td", column, text) for column, text in enumerate(row)) + "</tr>"
                       for row in self.table_rows())
        return (f'<table class="notebook-accel-metrics" style="border-collapse:collapse;margin:4px 0">'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
