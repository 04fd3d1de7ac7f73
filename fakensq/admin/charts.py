"""Line charts as inline SVG, drawn on the server with the rest of a page's section.

No charting library and no script: the live sections are re-rendered every
second anyway, so a chart is a section like any other.  Each line carries
``data-series`` (its name), ``data-last`` (its latest value) and ``data-peak``
(its highest), the chart ``data-max`` (the top of its axis): what the tests read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Line", "line_chart", "nice_ceiling", "PALETTE"]

#: Line colours, told apart by people with the common colour-vision deficiencies.
PALETTE = ("#2657a6", "#d9730d", "#1a7f37", "#c0262d", "#7b3fb5", "#0f8a8a", "#8a6d00", "#555e6b")

WIDTH = 560
HEIGHT = 190
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 12, 12, 26
#: Seconds between time ticks: the first that gives at most six.
_TICK_STEPS = (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass(frozen=True)
class Line:
    name: str
    points: Sequence[tuple[float, float | None]]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times 10^k at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        candidate = factor * 10.0**exponent
        if candidate >= value * (1 - 1e-12):
            return float(candidate)
    return 10.0 ** (exponent + 1)


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _last(points: Sequence[tuple[float, float | None]]) -> float | None:
    for _, value in reversed(points):
        if value is not None:
            return value
    return None


def line_chart(
    chart_id: str,
    title: str,
    lines: Sequence[Line],
    *,
    start: float,
    end: float,
    unit: str = "",
) -> str:
    """An SVG chart of ``lines`` over ``[start, end]`` (wall-clock seconds), with a
    legend that gives each line's latest value."""
    values = [v for line in lines for _, v in line.points if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM
    span = max(end - start, 1e-9)

    def x(t: float) -> float:
        return _LEFT + (t - start) / span * plot_w

    def y(v: float) -> float:
        return _TOP + plot_h - v / top * plot_h

    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}" '
        f'data-max="{top:g}">'
    ]
    for i in range(5):  # horizontal grid lines with their values
        v = top * i / 4
        yy = y(v)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" '
            f'y1="{yy:.1f}" y2="{yy:.1f}"/>'
            f'<text class="tick" x="{_LEFT - 6}" y="{yy + 4:.1f}" '
            f'text-anchor="end">{_fmt(v)}</text>'
        )
    step = next((c for c in _TICK_STEPS if span / c <= 6), _TICK_STEPS[-1])
    for k in range(int(span // step) + 1):  # ticks back from "now" at the right
        t = end - k * step
        seconds = k * step
        label = "now" if k == 0 else f"-{seconds // 60}m" if seconds % 60 == 0 else f"-{seconds}s"
        parts.append(
            f'<text class="tick" x="{x(t):.1f}" y="{HEIGHT - 8}" '
            f'text-anchor="middle">{label}</text>'
        )
    for i, line in enumerate(lines):
        colour = PALETTE[i % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for at, value in line.points:
            if value is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append(f"{x(at):.1f},{y(value):.1f}")
        last = _last(line.points)
        peak = max((v for _, v in line.points if v is not None), default=None)
        attrs = (
            f'data-series="{escape(line.name)}" data-last="{_attr(last)}" data-peak="{_attr(peak)}"'
        )
        parts.append(
            f'<g class="series" {attrs} stroke="{colour}"><title>{escape(line.name)}</title>'
        )
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="1.8" fill="{colour}"/>')
            elif run:
                parts.append(f'<polyline fill="none" stroke-width="1.8" points="{" ".join(run)}"/>')
        parts.append("</g>")
    parts.append("</svg>")
    legend = "".join(
        f'<li><span class="swatch" style="background:{PALETTE[i % len(PALETTE)]}"></span>'
        f"{escape(line.name)} <b>{_legend_value(_last(line.points), unit)}</b></li>"
        for i, line in enumerate(lines)
    )
    if not values:
        legend += '<li class="muted">collecting data…</li>'
    return (
        f'<figure class="chart-box"><figcaption>{escape(title)}</figcaption>'
        f'{"".join(parts)}<ul class="legend">{legend}</ul></figure>'
    )


def _attr(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _legend_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    text = f"{value:,.1f}" if value != int(value) else f"{int(value):,}"
    return f"{text}{unit}"
