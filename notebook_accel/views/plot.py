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
    if len(points) <= limit:
        return points
    stride = len(points) / limit
    picked = [points[int(i * stride)] for i in range(limit - 1)]
    picked.append(points[-1])
    return picked


def render_line_plot(title: str, series: Dict[int, Sequence[Point]], width: int = 380, height: int = 230,
                     x_label: str = "step", max_points: int = 400) -> str:
    """SVG text of a line plot with one line per rank (``series``: rank -> [(x, y), ...]).

    Example::

        svg = render_line_plot("loss", {0: [(0, 1.0), (1, 0.5)], 1: [(0, 1.1), (1, 0.6)]})
    """
    left, right, top, bottom = 56, 12, 28, 38
    plot_w, plot_h = width - left - right, height - top - bottom
    clean: Dict[int, Sequence[Point]] = {}
    for rank, points in sorted(series.items()):
        finite = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
        if finite:
            clean[rank] = _downsample(finite, max_points)
    parts: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img" '
        f'aria-label="{escape(title)} per rank" class="notebook-accel-plot">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold" fill="#222">{escape(title)}</text>',
    ]
    if not clean:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
                     f'fill="#888">no finite values yet</text></svg>')
        return "".join(parts)

    xs = [x for points in clean.values() for x, _ in points]
    ys = [y for points in clean.values() for _, y in points]
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
    x_ticks, y_ticks = nice_ticks(x_low, x_high, 5), nice_ticks(y_low, y_high, 4)

    def sx(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y_low) / (y_high - y_low) * plot_h

    # grid and tick labels
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for value in y_ticks:
        y = sy(value)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">'
                     f'{_tick_label(value, y_step)}</text>')
    for value in x_ticks:
        x = sx(value)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#f0f0f0"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 15}" text-anchor="middle" fill="#444">'
                     f'{_tick_label(value, x_step)}</text>')
    # axes
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" fill="#444">'
                 f'{escape(x_label)}</text>')
    parts.append(f'<text transform="translate(13 {top + plot_h / 2}) rotate(-90)" text-anchor="middle" '
                 f'fill="#444">{escape(title)}</text>')
    # one line per rank
    for rank, points in clean.items():
        colour = rank_colour(rank)
        if len(points) == 1:
            x, y = points[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}" '
                         f'data-rank="{rank}"/>')
        else:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" '
                         f'stroke-linejoin="round" data-rank="{rank}" points="{coords}"/>')
    # legend (top right, inside the plot): rank and its latest value
    entries = [(rank, points[-1][1]) for rank, points in clean.items()]
    legend_w = 118
    lx = left + plot_w - legend_w - 4
    ly = top + 4
    parts.append(f'<rect x="{lx}" y="{ly}" width="{legend_w}" height="{14 * len(entries) + 6}" '
                 f'fill="white" fill-opacity="0.85" stroke="#ccc"/>')
    for index, (rank, latest) in enumerate(entries):
        y = ly + 13 + 14 * index
        parts.append(f'<line x1="{lx + 6}" y1="{y - 4}" x2="{lx + 22}" y2="{y - 4}" '
                     f'stroke="{rank_colour(rank)}" stroke-width="2.5"/>')
        parts.append(f'<text x="{lx + 27}" y="{y}" fill="#222">rank {rank}: {format_value(latest)}</text>')
    parts.append("</svg>")
    return "".join(parts)


