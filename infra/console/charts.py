"""Small inline SVG charts, drawn on the server: no script, no CDN, readable at any width.

Pure functions from numbers to SVG text; every label is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 24, 40


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def nice_range(low: float, high: float) -> tuple[float, float, float]:
    """An axis from `low` to `high` widened to round numbers, and its tick step (four steps or so).

    >>> nice_range(0.562, 0.903)
    (0.5, 1.0, 0.1)
    >>> nice_range(3.0, 3.0)
    (2.0, 4.0, 0.5)
    """
    if low == high:
        low, high = low - 1, high + 1
    raw = (high - low) / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return (round(math.floor(low / step) * step, 10), round(math.ceil(high / step) * step, 10), step)


def line_chart(
    x_labels: Sequence[str],
    series: dict[str, Sequence[float | None]],
    title: str,
    y_label: str = "",
    y_range: tuple[float, float] | None = None,
) -> str:
    """An SVG line chart: one line per series over the shared x labels; None leaves a gap; `y_range`
    fixes the axis (fractions: 0 to 1) instead of fitting it to the values.

    >>> "<polyline" in line_chart(["a", "b"], {"s": [1.0, 2.0]}, "t")
    True
    """
    values = [v for points in series.values() for v in _finite(points)]
    if not x_labels or not values:
        return f'<p class="empty">{escape(title)}: no data yet</p>'
    low, high, tick = nice_range(*(y_range or (min(values), max(values))))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(x_labels) - 1)

    def x(i: int) -> float:
        return LEFT + (i * step if len(x_labels) > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - low) / (high - low))

    parts = [_axes(low, high, tick, y, x_labels, x, y_label)]
    for n, (name, points) in enumerate(series.items()):
        parts.append(_line(points, x, y, PALETTE[n % len(PALETTE)], name))
    legend = "".join(
        f'<span class="key"><i class="c{n % len(PALETTE)}"></i>{escape(name)}</span>'
        for n, name in enumerate(series)
    )
    return (
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">{"".join(parts)}</svg>'
        f'<div class="legend">{legend}</div></figure>'
    )


def _axes(low, high, tick, y, x_labels, x, y_label) -> str:
    out = [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" class="axis"/>']
    out.append(
        f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" class="axis"/>'
    )
    for k in range(round((high - low) / tick) + 1):
        v = low + k * tick
        out.append(
            f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" class="tick" text-anchor="end">{_short(v)}</text>'
        )
        out.append(f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{WIDTH - RIGHT}" y2="{y(v):.1f}" class="grid"/>')
    every = max(1, math.ceil(len(x_labels) / 8))
    for i, label in enumerate(x_labels):
        if i % every == 0 or i == len(x_labels) - 1:
            out.append(
                f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 16}" class="tick" text-anchor="middle">'
                f"{escape(str(label)[:16])}</text>"
            )
    if y_label:
        out.append(f'<text x="4" y="{TOP - 10}" class="tick">{escape(y_label)}</text>')
    return "".join(out)


def _line(points, x, y, color: str, name: str) -> str:
    runs, current = [], []
    for i, v in enumerate(points):
        if v is None or not math.isfinite(float(v)):
            if current:
                runs.append(current)
            current = []
        else:
            current.append((x(i), y(float(v)), float(v)))
    if current:
        runs.append(current)
    out = []
    for run in runs:
        coords = " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in run)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for px, py, v in run:
            out.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}">'
                f"<title>{escape(name)}: {_short(v)}</title></circle>"
            )
    return "".join(out)


def _short(value: float) -> str:
    """
    >>> _short(0.123456), _short(12345.0)
    ('0.123', '12345')
    """
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"
