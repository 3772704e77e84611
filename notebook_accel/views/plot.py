"""A small, dependency-free SVG line plot: axes with ticks, grid, a legend, one line per rank.

The dashboard puts the SVG in an ``ipywidgets.HTML``, so the plot is saved in the notebook's widget state
and renders in JupyterLab, Colab and VS Code without matplotlib in the kernel or a plotting extension.
"""
from __future__ import annotations

import math
from html import escape
from typing import Dict, List, Optional, Sequence, Tuple

from .model import format_value, rank_colour

Point = Tuple[float, float]


def nice_ticks(low: float, high: float, count: int = 5) -> List[float]:
    """About ``count`` round tick values (1, 2, 2.5, 5 × 10^k) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        value += step
    return ticks


def _tick_label(value: float, step: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.1e}"
    decimals = max(0, -int(math.floor(math.log10(step)))) if step > 0 else 0
    return f"{value:.{min(decimals, 6)}f}"


def _downsample(points: Sequence[Point], limit: int) -> Sequence[Point]:
    """At most ``limit`` points for drawing: the first, the last, and the lowest and highest point of each
    bucket between them (so a spike or a divergence stays visible; the data itself is not touched)."""
    if len(points) <= limit:
        return points
    buckets = max(1, (limit - 2) // 2)
    inner = points[1:-1]
    size = len(inner) / buckets
    picked = [points[0]]
    for index in range(buckets):
        bucket = inner[int(index * size):int((index + 1) * size)]
        if not bucket:
            continue
        low = min(range(len(bucket)), key=lambda i: bucket[i][1])
        high = max(range(len(bucket)), key=lambda i: bucket[i][1])
        picked.extend(bucket[i] for i in sorted({low, high}))
    picked.append(points[-1])
    return picked


def smooth(points: Sequence[Point], weight: float) -> List[Point]:
    """TensorBoard's smoothing: a debiased exponential moving average (``weight`` 0 = none, 0.99 = heavy)."""
    if weight <= 0 or len(points) < 2:
        return list(points)
    result, average, correction = [], 0.0, 1.0
    for x, y in points:
        average = weight * average + (1 - weight) * y
        correction *= weight
        result.append((x, average / (1 - correction)))
    return result


def wants_log_axis(values: Sequence[float]) -> bool:
    """A log y axis when every value is positive and they span more than two decades (1e3 .. 1e-3: yes)."""
    positive = [value for value in values if value > 0]
    return bool(positive) and len(positive) == len(values) and max(positive) / min(positive) > 100


def log_ticks(low: float, high: float) -> List[float]:
    """Powers of ten covering [low, high] (every other one when there are many)."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    step = max(1, math.ceil((last - first) / 8))
    return [10.0 ** k for k in range(first, last + 1, step)]


def _log_label(value: float) -> str:
    exponent = round(math.log10(value))
    return f"1e{exponent}" if not -3 <= exponent <= 3 else format_value(value)


# Theme-aware colours: JupyterLab's CSS variables (Notebook 7 and VS Code's Jupyter renderer define them
# too), with light-theme fallbacks for renderers that do not (nbviewer, Colab). Inline SVG in the page's DOM
# resolves ``var()`` in ``style``, not in presentation attributes, hence style="...".
_TEXT = "fill:var(--jp-ui-font-color1,#222)"
_MUTED = "fill:var(--jp-ui-font-color2,#555)"
_GRID = "stroke:var(--jp-border-color2,#e6e6e6)"
_AXIS = "stroke:var(--jp-ui-font-color2,#555)"
_BACKGROUND = "fill:var(--jp-layout-color0,#fff)"
_LEGEND = "fill:var(--jp-layout-color0,#fff);fill-opacity:0.85;stroke:var(--jp-border-color1,#ccc)"


PLOT_WIDTH = 380  # px, the dashboard's plots


def render_line_plot(title: str, series: Dict[int, Sequence[Point]], width: int = PLOT_WIDTH, height: int = 230,
                     x_label: str = "step", max_points: int = 400, log_y: Optional[bool] = None,
                     smoothing: float = 0.0) -> str:
    """SVG text of a line plot with one line per rank (``series``: rank -> [(x, y), ...]).

    ``log_y``: None picks a log axis when the values span more than two decades (``wants_log_axis``).
    ``smoothing`` (0..1) draws TensorBoard's moving average over a faint raw line. Hovering a line shows its
    rank and latest value; so does the legend. Example::

        svg = render_line_plot("loss", {0: [(0, 1.0), (1, 0.5)], 1: [(0, 1.1), (1, 0.6)]})
    """
    left, right, top, bottom = 56, 12, 28, 38
    plot_w, plot_h = width - left - right, height - top - bottom
    clean: Dict[int, List[Point]] = {}
    for rank, points in sorted(series.items()):
        finite = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
        if finite:
            clean[rank] = finite
    parts: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img" '
        f'aria-label="{escape(title)} per rank" class="notebook-accel-plot">',
        f'<rect x="0" y="0" width="{width}" height="{height}" style="{_BACKGROUND}"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold" style="{_TEXT}">{escape(title)}</text>',
    ]
    if not clean:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
                     f'style="{_MUTED}">no finite values yet</text></svg>')
        return "".join(parts)

    ys_all = [y for points in clean.values() for _, y in points]
    log = wants_log_axis(ys_all) if log_y is None else bool(log_y)
    if log and not all(y > 0 for y in ys_all):
        log = False  # a log axis cannot show zero or negative values: stay linear
    drawn = {rank: _downsample(smooth(points, smoothing), max_points) for rank, points in clean.items()}
    raw = {rank: _downsample(points, max_points) for rank, points in clean.items()} if smoothing > 0 else {}

    def ty(y: float) -> float:
        return math.log10(y) if log else y

    xs = [x for points in drawn.values() for x, _ in points]
    ys = [ty(y) for points in list(drawn.values()) + list(raw.values()) for _, y in points]
    x_low, x_high = min(xs), max(xs)
    y_low, y_high = min(ys), max(ys)
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    if y_high == y_low:
        pad = abs(y_low) * 0.1 or 1.0
        y_low, y_high = y_low - pad, y_high + pad
    else:
        pad = (y_high - y_low) * 0.05
        y_low, y_high = y_low - pad, y_high + pad
    x_ticks = nice_ticks(x_low, x_high, 5)
    if log:
        y_ticks = [math.log10(t) for t in log_ticks(10 ** y_low, 10 ** y_high) if y_low <= math.log10(t) <= y_high]
    else:
        y_ticks = nice_ticks(y_low, y_high, 4)

    def sx(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * plot_w

    def sy(y: float) -> float:  # y already transformed
        return top + plot_h - (y - y_low) / (y_high - y_low) * plot_h

    # grid and tick labels
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for value in y_ticks:
        y = sy(value)
        label = _log_label(10 ** value) if log else _tick_label(value, y_step)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" style="{_GRID}"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" style="{_MUTED}">{label}</text>')
    for value in x_ticks:
        x = sx(value)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" style="{_GRID}"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 15}" text-anchor="middle" style="{_MUTED}">'
                     f'{_tick_label(value, x_step)}</text>')
    # axes
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" style="{_AXIS}"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" style="{_AXIS}"/>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" style="{_MUTED}">'
                 f'{escape(x_label)}</text>')
    axis_title = f"{title} (log)" if log else title
    parts.append(f'<text transform="translate(13 {top + plot_h / 2}) rotate(-90)" text-anchor="middle" '
                 f'style="{_MUTED}" class="notebook-accel-y-label">{escape(axis_title)}</text>')
    # one line per rank (raw values faint behind the smoothed line when smoothing)
    for rank, points in raw.items():
        coords = " ".join(f"{sx(x):.1f},{sy(ty(y)):.1f}" for x, y in points)
        parts.append(f'<polyline fill="none" stroke="{rank_colour(rank)}" stroke-opacity="0.25" '
                     f'stroke-width="1" data-raw-rank="{rank}" points="{coords}"/>')
    # Ranks that logged the same values (lr, an eval gathered from every rank) draw the same line: each later one is
    # dashed, its gaps showing the earlier ranks' colours, and its legend says so (it hid rank 0's line).
    lines = {rank: " ".join(f"{sx(x):.1f},{sy(ty(y)):.1f}" for x, y in points) for rank, points in drawn.items()}
    same_as = {rank: next((other for other in drawn if other < rank and lines[other] == lines[rank]), None)
               for rank in drawn}
    overlaps = {rank: [other for other in drawn if lines[other] == lines[rank]] for rank in drawn}
    for rank, points in drawn.items():
        colour = rank_colour(rank)
        x_last, y_last = clean[rank][-1]
        alike = "" if same_as[rank] is None else f" (same as rank {same_as[rank]})"
        hover = f"<title>rank {rank}: {format_value(y_last)} at {x_label} {format_value(x_last)}{alike}</title>"
        if len(points) == 1:
            x, y = points[0]
            radius = 3 + len(overlaps[rank]) - 1 - overlaps[rank].index(rank)  # the later, the smaller: rings
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(ty(y)):.1f}" r="{radius}" fill="{colour}" '
                         f'data-rank="{rank}">{hover}</circle>')
        else:
            group = overlaps[rank]
            dashes = "" if same_as[rank] is None else \
                f' stroke-dasharray="6 {6 * (len(group) - 1)}" stroke-dashoffset="{-6 * (group.index(rank) - 1)}"'
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dashes} '
                         f'stroke-linejoin="round" data-rank="{rank}" points="{lines[rank]}">{hover}</polyline>')
    # legend (top right, inside the plot): rank and its latest (raw) value
    entries = [(rank, clean[rank][-1][1]) for rank in drawn]
    labels = {rank: f"rank {rank}: {format_value(latest)}" + ("" if same_as[rank] is None
                                                             else f" (same as rank {same_as[rank]})")
              for rank, latest in entries}
    legend_w = max(118, 32 + 6 * max(len(label) for label in labels.values()))
    lx = left + plot_w - legend_w - 4
    ly = top + 4
    parts.append(f'<rect x="{lx}" y="{ly}" width="{legend_w}" height="{14 * len(entries) + 6}" '
                 f'style="{_LEGEND}"/>')
    for index, rank in enumerate(labels):
        y = ly + 13 + 14 * index
        dashes = "" if same_as[rank] is None else ' stroke-dasharray="4 3"'
        parts.append(f'<line x1="{lx + 6}" y1="{y - 4}" x2="{lx + 22}" y2="{y - 4}" '
                     f'stroke="{rank_colour(rank)}" stroke-width="2.5"{dashes}/>')
        parts.append(f'<text x="{lx + 27}" y="{y}" style="{_TEXT}">{escape(labels[rank])}</text>')
    parts.append("</svg>")
    return "".join(parts)
