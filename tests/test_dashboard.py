"""The views fed with synthetic events (no kernel, no ranks): throttling, slots, failure, summaries, plots."""
from __future__ import annotations

import html
import io
import math
import re
import sys

import ipywidgets
import pytest

from notebook_accel.wire.events import (AttemptStarted, LaunchFinished, LaunchStarted, MetricReport, OutputLine,
                                        ProgressUpdate, RankExited, RankFailed, RankResult, RankStarted)
from notebook_accel.views import make_view
from notebook_accel.views.plot import nice_ticks, render_line_plot
from notebook_accel.views.text import TextView
from notebook_accel.views.widgets import WidgetView


class Clock:
    """Replaces time.monotonic in the views, so throttling is tested without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    import notebook_accel.views.model as model
    import notebook_accel.views.text as text
    import notebook_accel.views.widgets as widgets_module

    for module in (model, text, widgets_module):
        monkeypatch.setattr(module.time, "monotonic", clock)
    return clock


@pytest.fixture
def sent(monkeypatch):
    """Every widget state message: (widget, state dict)."""
    messages = []
    original = ipywidgets.Widget.send_state

    def record(self, key=None):
        state = self.get_state(key=key)
        if state:
            messages.append((self, state))
        return original(self, key)

    monkeypatch.setattr(ipywidgets.Widget, "send_state", record)
    return messages


def update(rank, bar_id, n, total=100, desc="train", closed=False, position=0, leave=True, elapsed=1.0):
    return ProgressUpdate(rank=rank, bar_id=bar_id, desc=desc, n=n, total=total, elapsed=elapsed, rate=None,
                          position=position, closed=closed, leave=leave,
                          format_dict={"n": n, "total": total, "elapsed": elapsed, "prefix": desc,
                                       "unit": "it", "ascii": False})


def start(view, world_size=2):
    view.handle(LaunchStarted(rank=-1, world_size=world_size, device="cpu", start_method="fork",
                              function_name="train"))
    for rank in range(world_size):
        view.handle(RankStarted(rank=rank, pid=4000 + rank))


def header_fields(view):
    """The header's labelled facts as text, e.g. {"device": "cuda", "world size": "4", "status": "running"}.

    Read field by field: the header's HTML also holds CSS numbers (``padding:2px 0 4px 0``), so a bare
    ``"4" in header`` would match whatever the world size is.
    """
    fields = {label.strip(): html.unescape(re.sub(r"<[^>]+>", "", value))
              for label, value in re.findall(r'([\w ]+): <b class="na-[\w-]+">(.*?)</b>', view.header.value)}
    title = re.search(r'<b>notebook_accel</b> <span[^>]*>(.*?)</span>', view.header.value)
    fields["function"] = html.unescape(title.group(1)) if title else ""
    return fields


def bar_rows(view, rank):
    return [row for row in view._rank_rows[rank].slots if not row.hidden]


def test_widget_updates_per_bar_are_throttled_and_the_final_state_is_exact(clock, sent):
    view = WidgetView(display=False)
    start(view, 1)
    total = 1_000_000
    # a rank sending 10 states a second for 10 s (what progress does), the supervisor ticking at 10 Hz
    for step in range(101):
        clock.now += 0.1
        view.handle(update(0, 1, n=step * total // 100, total=total, closed=step == 100))
        view.tick()
    row = bar_rows(view, 0)[0]
    assert row.bar.value == total and row.bar.max == total and row.bar.bar_style == "success"
    assert "1000000/1000000" in row.text.value
    bar_messages = [state for widget, state in sent if widget is row.bar]
    text_messages = [state for widget, state in sent if widget is row.text]
    # 10 s at ≤ 4 refreshes a second, 1 message per widget per refresh: ≤ 10 messages a second per bar
    assert len(bar_messages) <= 10 * 4 + 2 and len(text_messages) <= 10 * 4 + 2
    assert (len(bar_messages) + len(text_messages)) / 10 <= 8.5


def test_a_burst_of_updates_between_ticks_costs_one_refresh(clock, sent):
    view = WidgetView(display=False)
    start(view, 1)
    clock.now += 1
    for n in range(1, 1001):  # 1000 states within one instant
        view.handle(update(0, 1, n=n, total=1000, closed=False))
    row = bar_rows(view, 0)[0]
    assert sum(1 for widget, _ in sent if widget is row.bar) <= 2
    clock.now += 0.25
    view.tick()  # the pending state is flushed by the next tick
    assert row.bar.value == 1000


def test_inner_bars_reuse_their_row(clock):
    view = WidgetView(display=False)
    start(view, 1)
    bar_id = 1
    view.handle(update(0, bar_id, 0, total=50, desc="epoch"))
    for epoch in range(50):
        bar_id += 1
        view.handle(update(0, bar_id, 0, total=10, desc="step", position=1, leave=False))
        clock.now += 1
        view.handle(update(0, bar_id, 10, total=10, desc="step", position=1, leave=False, closed=True))
        view.handle(update(0, 1, epoch + 1, total=50, desc="epoch"))
    assert len(view._rank_rows[0].slots) == 2  # epoch row + one reused step row, not 51 rows
    visible = bar_rows(view, 0)
    assert [row.bar.description for row in visible] == ["epoch"]  # leave=False: the step bar is gone


def test_sequential_bars_with_leave_replace_the_closed_one(clock):
    view = WidgetView(display=False)
    start(view, 1)
    view.handle(update(0, 1, 5, total=5, desc="first", closed=True))
    view.handle(update(0, 2, 0, total=7, desc="second"))
    rows = bar_rows(view, 0)
    assert len(rows) == 1 and rows[0].bar.description == "second" and rows[0].bar.max == 7


def test_unknown_total_shows_an_info_bar_with_counts(clock):
    view = WidgetView(display=False)
    start(view, 1)
    view.handle(update(0, 1, 42, total=None, desc="stream", closed=True))
    row = bar_rows(view, 0)[0]
    assert row.bar.bar_style == "info" and "42it" in row.text.value


def test_output_lines_are_coalesced_labelled_and_cleaned(clock, monkeypatch):
    out = io.StringIO()
    writes = []
    real_write = out.write
    monkeypatch.setattr(out, "write", lambda text: writes.append(text) or real_write(text))
    monkeypatch.setattr("sys.stdout", out)
    view = WidgetView(display=False)
    start(view)
    for i in range(20_000):
        view.handle(OutputLine(rank=i % 2, stream="stdout", text=f"line {i}"))
        if i % 1000 == 0:
            clock.now += 0.3
            view.tick()
    view.handle(OutputLine(rank=1, stream="stdout", text="  0%|   | 0/3\r 33%|#  | 1/3\r100%|###| 3/3"))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=5.0))
    text = out.getvalue()
    assert len(writes) <= 25
    assert text.count("\n") == 20_001
    assert "[rank 0] line 0\n[rank 0] line 2\n" in text and "[rank 1] line 19999\n" in text
    for rank in range(2):  # lines that came together are written by rank, each rank's in its order
        mine = [line for line in text.splitlines() if line.startswith(f"[rank {rank}] line ")]
        assert mine == [f"[rank {rank}] line {i}" for i in range(rank, 20_000, 2)]
    assert text.endswith("[rank 1] 100%|###| 3/3\n")


def test_lines_that_come_together_are_written_in_rank_order(clock, monkeypatch):
    # a %%ranks cell: every rank prints at once, rank 1 happened to be first
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    view = WidgetView(display=False)
    start(view, 3)
    for rank in (2, 1, 0):
        view.handle(OutputLine(rank=rank, stream="stdout", text=f"value {rank}"))
        clock.now += 0.05
    view.tick()
    assert out.getvalue() == ""  # the first line waits for those that come with it...
    clock.now += 0.25
    view.tick()  # ... then all are written, by rank
    assert out.getvalue() == "[rank 0] value 0\n[rank 1] value 1\n[rank 2] value 2\n"
    view.handle(OutputLine(rank=1, stream="stdout", text="later"))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=1.0))
    assert out.getvalue().endswith("[rank 2] value 2\n[rank 1] later\n")


def test_metrics_feed_plots_and_the_bar_postfix(clock):
    view = WidgetView(display=False)
    start(view)
    for rank in range(2):
        view.handle(update(rank, 1, 0, total=100))
    for step in range(50):
        clock.now += 0.1
        for rank in range(2):
            view.handle(MetricReport(rank=rank, step=step, metrics={"loss": 1.0 / (step + 1) + rank, "lr": 0.1}))
            view.handle(update(rank, 1, step, total=100))
        view.tick()
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=5.0))
    assert set(view._plots) == {"loss", "lr"}
    svg = view._plots["loss"].value
    assert svg.count("<polyline") == 2 and 'data-rank="0"' in svg and 'data-rank="1"' in svg
    assert "rank 1: 1.02" in svg  # legend with the latest value
    assert "loss=0.02" in bar_rows(view, 0)[0].text.value and "lr=0.1" in bar_rows(view, 0)[0].text.value


def test_failure_marks_the_root_cause_and_shows_its_traceback(clock):
    view = WidgetView(display=False)
    start(view)
    for rank in range(2):
        view.handle(update(rank, 1, 30, total=100))
    view.handle(RankFailed(rank=1, exc_type="builtins.ValueError", message="bad batch",
                           traceback="Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                                     "ValueError: bad batch", exception=None))
    view.handle(RankExited(rank=1, exitcode=1))
    view.handle(RankExited(rank=0, exitcode=-15, signal_name="SIGTERM", stopped=True))  # as the supervisor sends
    view.handle(LaunchFinished(rank=-1, status="failed", elapsed=3.0, root_rank=1,
                               error="ValueError: bad batch", traceback="..."))
    root = view._rank_rows[1]
    assert "root cause" in root.label.value and root.box.layout.border_left.endswith("#d62728")
    assert "ValueError: bad batch" in root.error.value and "train.py" in root.error.value
    assert root.error.layout.display is None
    assert "root cause" not in view._rank_rows[0].label.value and "stopped" in view._rank_rows[0].label.value
    assert bar_rows(view, 1)[0].bar.bar_style == "danger"
    assert bar_rows(view, 0)[0].bar.bar_style == "warning"
    summary = view.summary()
    assert "failed" in summary and "[rank 1] failed (root cause)" in summary and "[rank 0] stopped" in summary
    assert "error: ValueError: bad batch" in summary


def test_an_exception_without_a_message_is_named_without_a_bare_colon(clock):
    # pdb's ``q`` raises BdbQuit(), Ctrl-C a bare KeyboardInterrupt: "BdbQuit", as Python's own last line says it
    view = WidgetView(display=False)
    start(view)
    view.handle(RankFailed(rank=1, exc_type="bdb.BdbQuit", message="", traceback="bdb.BdbQuit", exception=None))
    view.handle(LaunchFinished(rank=-1, status="failed", elapsed=1.0, root_rank=1, error="BdbQuit"))
    assert "<b>BdbQuit</b>" in view._rank_rows[1].error.value


@pytest.mark.parametrize("message, said", [("bad batch too", "(not the root cause)"),
                                            ("Connection closed by peer", "(collateral)")])
def test_a_later_failure_is_called_collateral_only_when_it_reacts_to_a_peer(clock, message, said):
    view = WidgetView(display=False)
    start(view)
    view.handle(RankFailed(rank=1, exc_type="builtins.ValueError", message="bad batch", traceback="ValueError",
                           exception=None))
    view.handle(RankFailed(rank=0, exc_type="builtins.RuntimeError", message=message,
                           traceback=f"RuntimeError: {message}", exception=None))
    view.handle(LaunchFinished(rank=-1, status="failed", elapsed=1.0, root_rank=1, error="ValueError: bad batch"))
    assert said in view._rank_rows[0].error.value
    assert "root cause" not in view._rank_rows[0].error.value.replace("(not the root cause)", "")


def test_text_plain_fallback_is_the_final_summary_not_a_frozen_zero(clock):
    view = WidgetView(display=False)
    start(view)
    for rank in range(2):
        view.handle(update(rank, 1, 0, total=100))
    for rank in range(2):
        clock.now += 1
        view.handle(update(rank, 1, 100, total=100, closed=True, elapsed=4.0))
        view.handle(RankResult(rank=rank, payload=b""))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=4.2))
    plain = view.widget._repr_mimebundle_()["text/plain"]
    lines = plain.splitlines()
    assert lines[0].startswith("notebook_accel: train() · 2 × cpu · finished · 00:04")
    assert len([line for line in lines if "100/100" in line and "100%" in line]) == 2
    assert not re.search(r"\b0%", plain)
    assert repr(view.widget) == plain


def test_widget_view_displays_itself_and_republishes_the_summary(clock, monkeypatch):
    published = []

    class Handle:
        def update(self, obj):
            published.append(("update", obj._repr_mimebundle_()["text/plain"]))

    def fake_display(obj, display_id=None):
        published.append(("display", obj._repr_mimebundle_()["text/plain"]))
        return Handle()

    monkeypatch.setattr("IPython.display.display", fake_display)
    view = WidgetView()
    start(view, 1)
    view.handle(update(0, 1, 3, total=3, closed=True))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=1.0))
    assert published[0][0] == "display" and ("starting" in published[0][1] or "running" in published[0][1])
    assert published[-1][0] == "update" and "3/3" in published[-1][1] and "finished" in published[-1][1]


def test_each_rank_row_shows_its_own_total_not_rank_0s(clock):
    # Issue 36: a 7-step bar on rank 1 read 7/10 when every row took rank 0's total. Both ranks' bars have the
    # same bar_id (each rank numbers its own bars from 1), the shape in which such a mix-up hides.
    widgets, out = WidgetView(display=False), io.StringIO()
    text = TextView(stdout=out, stderr=io.StringIO())
    totals = {0: 10, 1: 7}
    for view in (widgets, text):
        start(view)
        for rank, total in totals.items():
            view.handle(update(rank, 1, 3, total=total))
    clock.now += 1
    widgets.tick()
    for rank, total in totals.items():
        assert widgets.state.rank(rank).bars[1].update.total == total  # the kernel-side view model
        row = bar_rows(widgets, rank)[0]
        assert row.bar.max == total and row.bar.value == 3, (rank, row.bar.max)
        assert f" 3/{total} " in html.unescape(row.text.value), row.text.value
    for view in (widgets, text):
        for rank, total in totals.items():
            view.handle(update(rank, 1, total, total=total, closed=True))
            view.handle(RankResult(rank=rank, payload=b""))
        view.handle(LaunchFinished(rank=-1, status="finished", elapsed=2.0))
    for summary in (widgets.widget._repr_mimebundle_()["text/plain"], out.getvalue()):
        rows = [line for line in summary.splitlines() if "/10" in line or "/7" in line]
        assert any("10/10" in line for line in rows) and any("7/7" in line for line in rows), summary
        assert not any("7/10" in line or "10/7" in line for line in rows), summary
    for rank, total in totals.items():
        row = bar_rows(widgets, rank)[0]
        assert (row.bar.max, row.bar.value, row.bar.bar_style) == (total, total, "success"), rank


def test_stopped_launch_marks_running_ranks_stopped(clock):
    view = WidgetView(display=False)
    start(view)
    for rank in range(2):
        view.handle(update(rank, 1, 10, total=100))
    view.handle(LaunchFinished(rank=-1, status="stopped", elapsed=2.0, error="KeyboardInterrupt: stopped",
                               still_running=[0, 1]))
    assert all(bar_rows(view, rank)[0].bar.bar_style == "warning" for rank in range(2))
    assert "stopped" in view.header.value


def test_header_shows_device_world_size_status_and_elapsed(clock):
    view = WidgetView(display=False)
    assert header_fields(view)["status"] == "starting"
    view.handle(LaunchStarted(rank=-1, world_size=4, device="cuda", start_method="forkserver",
                              mixed_precision="bf16", function_name="fit"))
    clock.now += 75
    view.tick()
    assert header_fields(view) == {"function": "fit()", "device": "cuda", "world size": "4", "status": "starting",
                                   "elapsed": "01:15", "precision": "bf16"}
    for rank in range(4):
        view.handle(RankStarted(rank=rank, pid=rank + 1))
    assert header_fields(view)["status"] == "running"


# ------------------------------------------------------------------------------------------------ text view

def test_text_view_says_nothing_of_a_bar_that_opens_nor_of_a_leave_false_bar_that_closes(clock):
    # the demo: 10 epochs of a short inner loop (leave=False) took ~60 lines; a terminal shows neither
    out = io.StringIO()
    view = TextView(stdout=out, stderr=out)
    start(view)
    for epoch in range(10):
        for rank in range(2):
            view.handle(update(rank, 100 + epoch, 0, total=12, desc=f"epoch {epoch}", position=1, leave=False))
        clock.now += 0.3
        for rank in range(2):
            view.handle(update(rank, 100 + epoch, 12, total=12, desc=f"epoch {epoch}", position=1, leave=False,
                               closed=True))
            view.handle(update(rank, 1, epoch + 1, total=10, desc="epochs", closed=epoch == 9))
        view.tick()
    lines = out.getvalue().splitlines()
    assert not [line for line in lines if "epoch " in line or "| 0/10 " in line], lines
    bars = [line for line in lines if "epochs:" in line and not line.startswith("notebook_accel")]
    assert 2 <= len(bars) <= 2 * (3 / 2 + 1) + 2, lines  # 3 s: a line a bar every 2 s, the close, the summary


def test_text_view_writes_the_librarys_notices_to_stderr_as_a_session_does(clock):
    # issue 45: a launch's "pending in the queue" went to stdout, a Session's (no view yet) to stderr
    from notebook_accel.wire.events import SessionNotice

    out, err = io.StringIO(), io.StringIO()
    view = TextView(stdout=out, stderr=err)
    start(view)
    view.handle(SessionNotice(rank=-1, text="Slurm job 7 is pending in the queue (Resources)"))
    assert err.getvalue() == "notebook_accel: Slurm job 7 is pending in the queue (Resources)\n"
    assert "pending" not in out.getvalue()


def test_text_view_prints_throttled_progress_labelled_logs_and_a_summary(clock):
    out, err = io.StringIO(), io.StringIO()
    view = TextView(stdout=out, stderr=err)
    start(view)
    for step in range(1, 101):
        clock.now += 0.1
        for rank in range(2):
            view.handle(update(rank, 1, step, total=100, closed=step == 100))
        view.tick()
    view.handle(OutputLine(rank=1, stream="stderr", text="warning: slow"))
    view.handle(MetricReport(rank=0, step=100, metrics={"loss": 0.125}))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=10.0))
    lines = out.getvalue().splitlines()
    progress_lines = [line for line in lines if "it/s" in line or "?it/s" in line or "|" in line]
    # 10 s at one line per bar every 2 s, plus the close, plus the summary: a few a second at most
    assert len(progress_lines) <= 2 * (10 / 2 + 2) + 2, lines
    assert err.getvalue() == "[rank 1] warning: slow\n"
    # each bar's last line was printed as it closed: the summary does not repeat it (issue 46)
    assert lines[-6].startswith("notebook_accel: train() · 2 × cpu · finished")
    assert lines[-5:-3] == ["[rank 0] finished", "[rank 1] finished"]
    assert sum("100/100" in line for line in lines) == 2, lines
    # the final metrics table (last/min/max per metric per rank), plain text
    assert lines[-3:] == ["metrics:", "  metric  rank   last    min    max  reports",
                          "  loss    0     0.125  0.125  0.125        1"]


class CellStream(io.StringIO):
    """A stream as ipykernel's: what is written reaches the cell (``shown``, shared by stdout and stderr) only when
    it is flushed, so two streams' lines show in the order of their flushes, not of their writes."""

    def __init__(self, name, shown):
        super().__init__()
        self.name, self.shown, self.buffered = name, shown, ""

    def write(self, text):
        self.buffered += text
        return len(text)

    def flush(self):
        self.shown.extend((self.name, line) for line in self.buffered.splitlines())
        self.buffered = ""


def test_text_view_keeps_a_ranks_stderr_note_before_the_summary(clock):
    # issue 46: "[rank 1] notebook_accel: rank 1's breakpoint ... was skipped" (stderr) showed after the summary
    # (stdout): the view flushed stdout first at the end, and ipykernel shows each stream as it is flushed
    shown = []
    view = TextView(stdout=CellStream("stdout", shown), stderr=CellStream("stderr", shown))
    start(view)
    view.handle(OutputLine(rank=0, stream="stdout", text="loading"))
    view.handle(OutputLine(rank=1, stream="stderr", text="notebook_accel: rank 1's breakpoint was skipped"))
    for rank in range(2):
        view.handle(RankResult(rank=rank, payload=b""))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=1.0))
    lines = [line for _, line in shown]
    assert lines.index("[rank 0] loading") < lines.index("[rank 1] notebook_accel: rank 1's breakpoint was skipped")
    assert lines.index("[rank 1] notebook_accel: rank 1's breakpoint was skipped") < \
        [line.startswith("notebook_accel: train()") for line in lines].index(True), shown


def test_make_view_picks_text_outside_a_kernel():
    assert isinstance(make_view("text"), TextView)
    assert isinstance(make_view("auto"), TextView)
    assert isinstance(make_view("widgets"), WidgetView)


# ------------------------------------------------------------------------------------------------ plot

def test_plot_has_axes_legend_and_one_line_per_rank():
    svg = render_line_plot("loss", {0: [(0, 1.0), (10, 0.5), (20, 0.25)], 1: [(0, 1.2), (20, 0.3)]})
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2 and ">step<" in svg and ">loss<" in svg
    assert "rank 0: 0.25" in svg and "rank 1: 0.3" in svg
    assert re.search(r">0\.5<|>0\.50<", svg)  # y tick labels


def test_ranks_with_the_same_values_both_stay_visible():
    # issue 46: where two ranks log the same lr or eval_loss, rank 1's line was drawn over rank 0's: only orange
    same = [(0, 1.0), (10, 0.5), (20, 0.25)]
    svg = render_line_plot("lr", {0: same, 1: list(same), 2: [(0, 2.0), (20, 1.0)]})
    lines = dict(re.findall(r'<polyline ([^>]*data-rank="(\d)")', svg)[i][::-1] for i in range(3))
    assert "stroke-dasharray" not in lines["0"] and "stroke-dasharray" not in lines["2"], svg
    assert "stroke-dasharray" in lines["1"], svg  # rank 0's colour shows between its dashes
    assert "rank 1: 0.25 (same as rank 0)" in svg


def test_four_plots_make_two_rows_of_two_not_three_and_one(clock):
    # issue 46: the no_trainer notebook's fourth chart wrapped alone onto a second row
    view = WidgetView(display=False)
    start(view)
    for count, name in enumerate(("loss", "lr", "eval_loss", "perplexity"), 1):
        view.handle(MetricReport(rank=0, step=1, metrics={name: 1.0}))
        clock.now += 5
        view.tick()
        assert len(view.plots_box.children) == count
        widths = {1: 1, 2: 2, 3: 3, 4: 2}  # plots a row can hold at most, so that the rows are even
        assert view.plots_box.layout.max_width == f"{widths[count] * 388}px", view.plots_box.layout.max_width


def test_plot_survives_nan_single_points_and_constants():
    assert "no finite values" in render_line_plot("x", {0: [(0, math.nan)]})
    single = render_line_plot("x", {0: [(3, 1.0)]})
    assert "<circle" in single
    constant = render_line_plot("x", {0: [(0, 2.0), (1, 2.0)], 1: [(0, math.inf), (1, 2.0)]})
    assert constant.count("<polyline") == 1 and "<circle" in constant


def test_plot_downsamples_long_series():
    svg = render_line_plot("x", {0: [(i, math.sin(i / 100)) for i in range(100_000)]}, max_points=300)
    points = re.search(r'points="([^"]+)"', svg).group(1).split()
    assert len(points) == 300 and len(svg) < 20_000


def test_nice_ticks_are_round():
    assert nice_ticks(0, 1, 5) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(0, 950, 5) == [0, 200, 400, 600, 800]
    ticks = nice_ticks(-0.013, 0.087, 4)
    assert all(abs(t * 40 - round(t * 40)) < 1e-9 for t in ticks)


def node_events(view):
    """What node 1 of 2 sees: its ranks 2 and 3, a failure of rank 0 on node 0, then a restart."""
    view.handle(LaunchStarted(rank=-1, world_size=4, device="cpu", start_method="fork", function_name="train",
                              num_nodes=2, node_rank=1, ranks=[2, 3]))
    view.handle(AttemptStarted(rank=-1, attempt=0, max_restarts=1))
    for rank in (2, 3):
        view.handle(RankStarted(rank=rank, pid=4000 + rank))
    view.handle(update(2, 1, 30, total=100))
    view.handle(RankFailed(rank=3, exc_type="builtins.RuntimeError", message="Connection closed by peer",
                           traceback="RuntimeError: Connection closed by peer", exception=None))
    view.handle(AttemptStarted(rank=-1, attempt=1, max_restarts=1,
                               previous_errors=["rank 0 on node 0 (host-a): ValueError: bad batch"]))
    for rank in (2, 3):
        view.handle(RankStarted(rank=rank, pid=5000 + rank))


def test_a_node_shows_only_its_ranks_its_place_and_the_attempt(clock):
    out = io.StringIO()
    view = TextView(stdout=out, stderr=out)
    node_events(view)
    for rank in (2, 3):
        view.handle(RankResult(rank=rank, payload=b""))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=2.0))
    lines = out.getvalue().splitlines()
    summary = lines[[line.startswith("notebook_accel: ") for line in lines].index(True):]
    assert summary[0].startswith("notebook_accel: train() · 4 × cpu · node rank 1 of 2 · attempt 2/2 · finished")
    assert "attempt 1: rank 0 on node 0 (host-a): ValueError: bad batch" in summary
    assert not any(line.startswith(("[rank 0]", "[rank 1]")) for line in summary)
    assert "[rank 3] finished" in summary  # its failure in attempt 1 was cleared by the restart


def test_the_dashboard_starts_fresh_rows_on_a_restart_and_names_a_remote_root_cause(clock):
    view = WidgetView(display=False)
    node_events(view)
    assert sorted(view._rank_rows) == [2, 3]
    assert view._rank_rows[3].error.layout.display == "none"   # attempt 1's failure panel is gone
    assert bar_rows(view, 2) == []                              # and so is its progress bar
    header = view.header.value
    assert "node rank: <b" in header and "1 of 2" in header and "attempt: <b" in header and "2/2" in header
    assert "rank 0 on node 0 (host-a): ValueError: bad batch" in header
    view.handle(LaunchFinished(rank=-1, status="failed", elapsed=2.0, root_rank=0, error="ValueError: bad"))
    assert sorted(view._rank_rows) == [2, 3] and 0 not in view.state.ranks  # rank 0 runs on the other node


def test_the_dashboard_says_when_a_finished_rank_leaves_its_peers_waiting(clock):
    from notebook_accel.wire.events import PeersWaiting

    view = WidgetView(display=False)
    view.handle(LaunchStarted(rank=-1, world_size=2, device="cpu", start_method="fork", function_name="train"))
    for rank in (0, 1):
        view.handle(RankStarted(rank=rank, pid=100 + rank))
    text = "rank 0 finished 31 s ago, but 1 rank(s) still run, perhaps waiting for it: rank 1 in all_reduce, ..."
    assert "waiting" not in view.header.value
    view.handle(PeersWaiting(rank=-1, finished_rank=0, waiting=[1], seconds=31.0, text=text))
    assert "waiting: <b" in view.header.value and "rank 1 in all_reduce" in view.header.value
    view.handle(LaunchFinished(rank=-1, status="stopped", elapsed=40.0, still_running=[1]))
    assert "perhaps waiting" not in view.header.value  # said while it mattered


# ------------------------------------------------------------------------------------------------ Launch.metrics

def test_launch_metrics_is_a_dataframe_or_an_error_naming_the_extra(monkeypatch):
    # issue 46: without pandas, Launch.metrics became a list and the notebook's `.groupby` cell failed with
    # "'list' object has no attribute 'groupby'": one type, whatever is installed, or an error saying what to install
    from notebook_accel.monitor.metric_log import MetricLog

    log = MetricLog()
    log.add(MetricReport(rank=1, step=3, metrics={"loss": 0.5}))
    frame = log.table()
    assert list(frame.columns) == ["rank", "step", "time", "name", "value"]
    assert frame.groupby("name")["value"].last()["loss"] == 0.5
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError, as without it
    with pytest.raises(ImportError, match=r"notebook_accel\[notebooks\]") as raised:
        log.table()
    assert "metric_log.rows()" in str(raised.value)
    assert log.rows()[0].value == 0.5


def test_a_rank_gone_before_its_start_is_read_still_gets_the_peak_it_reported():
    # A short run on a busy machine: the kernel reads RankStarted after the rank ended (psutil cannot find the pid);
    # the peak the rank sent next must still reach its row ("[rank 0] finished" lacked "peak RSS" once a suite run).
    import subprocess
    import sys

    from notebook_accel.monitor.resources import ResourceSampler
    from notebook_accel.wire.events import PeakMemoryReport, RankStarted, ResourceSample

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    delivered = []
    sampler = ResourceSampler(delivered.append)
    sampler.observe(RankStarted(rank=0, pid=ended.pid))
    sampler.observe(PeakMemoryReport(rank=0, peak_rss=200 << 20))
    assert [(type(event), event.peak_rss) for event in delivered] == [(ResourceSample, 200 << 20)]


def test_ranks_interrupted_by_a_stop_are_stopped_rows_as_the_headline_says(clock):
    # issue 45: after Ctrl-C on Slurm the headline said "stopped" and every rank's row "failed" — a relayed rank is
    # interrupted (it raises KeyboardInterrupt), not killed. A rank that raised something else stays failed.
    view = WidgetView(display=False)
    start(view)
    for rank in range(2):
        view.handle(update(rank, 1, 30, total=100))
    view.handle(RankFailed(rank=0, exc_type="builtins.KeyboardInterrupt", message="", traceback="KeyboardInterrupt",
                           exception=None))
    view.handle(RankFailed(rank=1, exc_type="builtins.ValueError", message="bad batch", traceback="ValueError",
                           exception=None))
    for rank in range(2):
        view.handle(RankExited(rank=rank, exitcode=1, stopped=True))
    view.handle(LaunchFinished(rank=-1, status="stopped", elapsed=3.0))
    summary = view.summary()
    assert "[rank 0] stopped" in summary and "[rank 1] failed" in summary, summary
