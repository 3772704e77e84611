"""The debugging parts of the views, fed with synthetic events (no kernel, no ranks): finished loops,
stragglers and stalls, resources in the rows, the stacks button, the metrics table."""
from __future__ import annotations

import io
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))

from test_dashboard import Clock, bar_rows, clock, sent, start, update  # noqa: E402,F401  (fixtures)

from notebook_accel.wire.events import LaunchFinished, MetricReport, OutputLine, ResourceSample  # noqa: E402
from notebook_accel.views.text import TextView  # noqa: E402
from notebook_accel.views.widgets import WidgetView  # noqa: E402


def test_finished_leave_true_loops_stay_as_summary_lines(clock):
    view = WidgetView(display=False)
    start(view, 1)
    bar_id = 1
    for epoch in range(3):  # three epochs of an inner loop (leave=True, tqdm's default) ...
        bar_id += 1
        view.handle(update(0, bar_id, 0, total=20, desc=f"epoch {epoch}"))
        clock.now += 1
        view.handle(update(0, bar_id, 20, total=20, desc=f"epoch {epoch}", closed=True, elapsed=2.0))
    bar_id += 1  # ... and a leave=False loop, which disappears as in tqdm
    view.handle(update(0, bar_id, 0, total=5, desc="eval", leave=False))
    view.handle(update(0, bar_id, 5, total=5, desc="eval", leave=False, closed=True))
    row = view._rank_rows[0]
    assert len(row.slots) == 1  # one slot, reused
    done = row.done.value
    assert "epoch 0: 20/20 [00:02" in done and "epoch 1: 20/20" in done and "epoch 2" in done
    assert "eval" not in done
    assert row.done.layout.display is None
    summary = view.summary()
    assert "[rank 0] ✓ epoch 0: 20/20 [00:02" in summary and "eval" not in summary


def test_many_finished_loops_keep_a_bounded_list(clock):
    view = WidgetView(display=False)
    start(view, 1)
    for bar_id in range(2, 32):
        view.handle(update(0, bar_id, 10, total=10, desc=f"epoch {bar_id}", closed=True))
    state = view.state.rank(0)
    assert state.finished_loop_count == 29 and len(state.finished_loops) == 8
    assert "… 21 earlier finished loops" in view._rank_rows[0].done.value


def test_a_rank_without_progress_while_its_peer_advances_is_marked_stalled(clock):
    view = WidgetView(display=False)
    start(view, 2)
    view.handle(OutputLine(rank=1, stream="stdout", text="about to sleep"))
    for step in range(1, 61):  # rank 0 advances for 60 s; rank 1 stays at 3
        clock.now += 1
        view.handle(update(0, 1, step, total=100))
        if step <= 3:
            view.handle(update(1, 2, step, total=100))
        view.tick()
    label = view._rank_rows[1].label.value
    assert "no progress for 57 s" in label or "no progress for 56 s" in label, label
    assert "last output" in label
    assert "no progress" not in view._rank_rows[0].label.value
    # rank 1 moves again: the mark goes away
    clock.now += 1
    view.handle(update(1, 2, 4, total=100))
    clock.now += 2
    view.tick()
    assert "no progress" not in view._rank_rows[1].label.value


def test_everyone_waiting_is_not_a_stall(clock):
    view = WidgetView(display=False)
    start(view, 2)
    view.handle(update(0, 1, 1, total=100))
    view.handle(update(1, 2, 1, total=100))
    clock.now += 60
    view.tick()
    assert all("no progress" not in view._rank_rows[rank].label.value for rank in (0, 1))


def test_the_stall_threshold_is_configurable_and_the_text_view_reports_a_stall_once(clock):
    out = io.StringIO()
    view = TextView(stdout=out)
    view.state.stall_after = 3.0
    start(view, 2)
    for step in range(1, 11):
        clock.now += 1
        view.handle(update(0, 1, step, total=100))
        view.tick()
    stall_lines = [line for line in out.getvalue().splitlines() if "no progress" in line]
    assert len(stall_lines) == 1 and stall_lines[0].startswith("[rank 1] no progress for 3 s")


def test_the_slowest_rank_by_rate_is_marked(clock):
    view = WidgetView(display=False)
    start(view, 3)
    for rank, rate in ((0, 30.0), (1, 31.0), (2, 12.0)):
        event = update(rank, 1, 5, total=100)
        event.rate = rate
        view.handle(event)
    clock.now += 1
    view.tick()
    assert "slowest: 12 it/s (others 30.5 it/s)" in view._rank_rows[2].label.value
    assert "slowest" not in view._rank_rows[0].label.value


def test_resources_show_in_each_row_and_the_header_totals(clock, sent):
    view = WidgetView(display=False)
    start(view, 2)
    gib = 2 ** 30
    for second in range(10):
        clock.now += 1
        for rank in (0, 1):
            view.handle(ResourceSample(rank=rank, rss=(rank + 1) * gib // 2, peak_rss=gib, cpu_percent=95.0,
                                       device_used=(rank + 3) * gib, device_total=80 * gib,
                                       device_peak=5 * gib, device_util=87.0,
                                       device_peak_allocated=4 * gib))
        view.tick()
    label = view._rank_rows[1].label.value
    assert "RSS 1.0 GiB" in label and "CPU 95%" in label and "GPU 4.0 GiB/80.0 GiB" in label
    assert "torch peak 4.0 GiB" in label and "util 87%" in label
    assert "RSS 1.5 GiB" in view.header.value and "CPU 190%" in view.header.value
    label_messages = [state for widget, state in sent if widget is view._rank_rows[1].label]
    assert len(label_messages) <= 10 + 1  # at most one redraw a second per rank (2 ranks)


def test_labels_of_eight_ranks_redraw_at_most_four_times_a_second_in_total(clock, sent):
    view = WidgetView(display=False)
    start(view, 8)
    sent.clear()
    for tick in range(200):  # 20 s, a sample per rank every second, ticks at 10 Hz
        clock.now += 0.1
        if tick % 10 == 0:
            for rank in range(8):
                view.handle(ResourceSample(rank=rank, rss=tick * 2 ** 20, cpu_percent=float(tick)))
        view.tick()
    labels = {id(row.label) for row in view._rank_rows.values()}
    label_messages = [1 for widget, _ in sent if id(widget) in labels]
    assert len(label_messages) / 20 <= 4.5


def test_the_stacks_button_shows_each_ranks_stack(clock):
    view = WidgetView(display=False)
    view.on_dump_stacks = lambda: {0: 'File "train.py", line 3 in train', 1: 'File "train.py", line 9 in step'}
    start(view, 2)
    assert view.stacks_button.layout.display is None
    view.stacks_button.click()
    assert 'line 9 in step' in view._rank_rows[1].stacks.value
    assert view._rank_rows[0].stacks.layout.display is None
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=1.0))
    assert view.stacks_button.layout.display == "none"


def test_the_final_metrics_table_is_in_the_widget_and_the_summary(clock):
    view = WidgetView(display=False)
    start(view, 2)
    for step in range(5):
        for rank in (0, 1):
            view.handle(MetricReport(rank=rank, step=step, metrics={"loss": 10.0 - step - rank}))
    view.handle(LaunchFinished(rank=-1, status="finished", elapsed=1.0))
    table = view.metrics_table.value
    cells = re.sub(r' style="[^"]*"', "", table)  # (spacing and alignment are the cells' style)
    assert "<table" in table and "<td>loss</td><td>1</td><td>5</td><td>5</td><td>9</td>" in cells
    assert "padding:" in table and "text-align:right" in table  # not the cramped default of a front end
    assert "  loss    1        5    5    9        5" in view.summary()


# ------------------------------------------------------------------------------------------------ plots
import math  # noqa: E402
import re  # noqa: E402

from notebook_accel.views.plot import render_line_plot, wants_log_axis  # noqa: E402


def y_labels(svg):
    return re.findall(r'text-anchor="end" style="[^"]*">([^<]+)</text>', svg)


def test_a_loss_spanning_six_decades_gets_a_log_axis_and_the_user_can_toggle_it(clock):
    view = WidgetView(display=False)
    start(view, 2)
    for step in range(200):
        for rank in (0, 1):
            view.handle(MetricReport(rank=rank, step=step, metrics={"loss": 1e3 * 10 ** (-6 * step / 199) * (1 + rank),
                                                                   "acc": step / 200}))
    clock.now += 2
    view.tick()
    svg = view._plots["loss"].value
    assert "loss (log)" in svg and {"0.001", "0.01", "0.1", "1", "10", "100", "1000"} <= set(y_labels(svg))
    assert "(log)" not in view._plots["acc"].value  # 0..1: linear
    view._plot_scales["loss"].value = "linear"  # the user's choice wins, at once
    assert "loss (log)" not in view._plots["loss"].value
    view._plot_scales["acc"].value = "log"
    assert "(log)" not in view._plots["acc"].value  # acc starts at 0: a log axis cannot show it, stays linear
    assert wants_log_axis([1e3, 1e-3]) and not wants_log_axis([1.0, 50.0]) and not wants_log_axis([0.0, 1e3])


def test_smoothing_draws_a_moving_average_over_the_faint_raw_line(clock):
    view = WidgetView(display=False)
    start(view, 1)
    for step in range(100):
        view.handle(MetricReport(rank=0, step=step, metrics={"loss": 1.0 + (step % 2)}))  # zig-zag
    clock.now += 2
    view.tick()
    assert "data-raw-rank" not in view._plots["loss"].value
    view.smoothing.value = 0.9
    svg = view._plots["loss"].value
    assert 'data-raw-rank="0"' in svg and 'data-rank="0"' in svg
    smoothed = re.search(r'data-rank="0" points="([^"]+)"', svg).group(1).split()
    ys = [float(point.split(",")[1]) for point in smoothed[-20:]]
    assert max(ys) - min(ys) < 20  # the zig-zag (a full plot height apart) is smoothed out


def test_x_is_time_when_no_step_is_given(clock):
    view = WidgetView(display=False)
    start(view, 1)
    base = view.state.start_wall
    for second in range(5):
        view.handle(MetricReport(rank=0, step=None, metrics={"gpu_temp": 60.0 + second}, time=base + second))
    clock.now += 2
    view.tick()
    assert ">time (s)<" in view._plots["gpu_temp"].value
    assert [x for x, _ in view.state.series["gpu_temp"][0].view()] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_eight_ranks_of_ten_thousand_points_stay_readable():
    series = {rank: [(step, math.exp(-step / 3000) + 0.01 * rank + (0.5 if step == 7777 else 0.0))
                     for step in range(10_000)] for rank in range(8)}
    svg = render_line_plot("loss", series)
    lines = re.findall(r'data-rank="(\d)" points="([^"]+)"', svg)
    assert len(lines) == 8 and all(len(points.split()) <= 400 for _, points in lines)
    assert len(svg) < 150_000
    # the spike at step 7777 survives downsampling (min/max per bucket)
    top = min(float(point.split(",")[1]) for point in lines[0][1].split())
    assert top < 60, top
    # hovering a line shows its rank and latest value; the legend lists all 8
    assert svg.count("<title>rank ") == 8 and all(f"rank {rank}: " in svg for rank in range(8))


def test_plots_of_four_metrics_redraw_at_most_three_times_a_second(clock, sent):
    view = WidgetView(display=False)
    start(view, 8)
    for tick in range(100):  # 10 s, every rank reports 4 metrics at 10 Hz
        clock.now += 0.1
        for rank in range(8):
            view.handle(MetricReport(rank=rank, step=tick, metrics={f"m{i}": tick * (i + 1) for i in range(4)}))
        view.tick()
    plots = {id(plot) for plot in view._plots.values()}
    assert len(plots) == 4
    assert sum(1 for widget, _ in sent if id(widget) in plots) / 10 <= 3.2


# ------------------------------------------------------------------------------------------------ frontends
import types  # noqa: E402


def test_colab_gets_its_custom_widget_manager_or_the_text_view(monkeypatch, capsys):
    """Fake ``google.colab`` modules (this is not Colab): the real one has ``output.enable_custom_widget_manager``."""
    from notebook_accel import views

    calls = []
    colab = types.ModuleType("google.colab")
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: calls.append("enabled")
    colab.output = output
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    monkeypatch.setattr(views, "in_notebook_kernel", lambda: True)
    assert isinstance(views.make_view("auto"), WidgetView) and calls == ["enabled"]

    def broken():
        raise RuntimeError("no widget manager here")

    output.enable_custom_widget_manager = broken
    assert isinstance(views.make_view("auto"), TextView)
    assert "enable_custom_widget_manager()" in capsys.readouterr().err


def test_colours_follow_the_theme():
    from notebook_accel.views.widgets import readable

    svg = render_line_plot("loss", {0: [(0, 1.0), (1, 0.5)]})
    assert "var(--jp-layout-color0,#fff)" in svg and "var(--jp-ui-font-color1,#222)" in svg
    assert 'fill="white"' not in svg and 'fill="#222"' not in svg
    assert readable("#1f77b4").endswith("color-mix(in srgb, #1f77b4 75%, var(--jp-ui-font-color1, #000))")


# ------------------------------------------------------------------------ a rank at a pdb prompt (issue 27)

def _prompt(rank, seq, lineno=12, kind=None):
    from notebook_accel.wire.events import PromptKind, RankPrompt

    return RankPrompt(rank=rank, prompt="(Pdb) ", seq=seq, kind=kind or PromptKind.BREAKPOINT,
                      filename="/home/me/train.py", lineno=lineno)


def test_a_rank_at_a_breakpoint_shows_where_in_the_widget_and_the_text_view(clock):
    from notebook_accel.wire.events import PromptAnswered

    view = WidgetView(display=False)
    out = io.StringIO()
    text = TextView(stdout=out)
    for each in (view, text):
        start(each, 2)
        each.handle(_prompt(1, 1))
    assert "at breakpoint (train.py:12)" in view._rank_rows[1].label.value
    assert "at breakpoint" not in view._rank_rows[0].label.value
    # a step (n) keeps the rank in pdb: the text view says where it stopped once, not at every step
    for each in (view, text):
        each.handle(PromptAnswered(rank=1, seq=1, ran_on=False))
        each.handle(_prompt(1, 2, lineno=13))
    assert "at breakpoint (train.py:13)" in view._rank_rows[1].label.value
    for each in (view, text):
        each.handle(PromptAnswered(rank=1, seq=2, ran_on=True))  # c: it runs again
    assert "at breakpoint" not in view._rank_rows[1].label.value
    assert "running" in view._rank_rows[1].label.value
    text.handle(_prompt(1, 3, lineno=20))  # the next breakpoint is said again
    said = [line for line in out.getvalue().splitlines() if "at breakpoint" in line]
    assert said == ["[rank 1] notebook_accel: at breakpoint (train.py:12)",
                    "[rank 1] notebook_accel: at breakpoint (train.py:20)"], out.getvalue()


def test_no_stall_is_marked_while_a_rank_sits_at_a_prompt_nor_right_after(clock):
    from notebook_accel.wire.events import PromptAnswered

    out = io.StringIO()
    text = TextView(stdout=out)
    view = WidgetView(display=False)
    for each in (view, text):
        start(each, 3)
    for step in range(1, 4):
        clock.now += 1
        for each in (view, text):
            for rank in range(3):
                each.handle(update(rank, rank + 1, step, total=100))
    for each in (view, text):
        each.handle(_prompt(0, 1))
    for step in range(4, 64):  # rank 0 debugged for a minute; rank 1 waits for it, rank 2 still advances
        clock.now += 1
        for each in (view, text):
            each.handle(update(2, 3, step, total=100))
            each.tick()
    assert "no progress" not in view._rank_rows[1].label.value
    for each in (view, text):  # c: rank 0 runs on; rank 1 has not moved yet, but was waiting for rank 0
        each.handle(PromptAnswered(rank=0, seq=1, ran_on=True))
        clock.now += 1
        each.tick()
    assert all("no progress" not in view._rank_rows[rank].label.value for rank in range(3))
    assert "no progress" not in out.getvalue(), out.getvalue()
