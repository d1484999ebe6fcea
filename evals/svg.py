"""Hand-written inline SVG plots for the HTML report: histogram, bar chart, line chart, timeline.

Each function returns one ``<svg>`` element as a string, with a title, axes and
tick labels, and no scripts or external resources. Text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 560, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 40  # margins around the plot area
COLOR = "#3b6ea8"
# Bar kinds of a timeline, and their colors.
TIMELINE_COLORS = {"wait": "#b9cde5", "turn": COLOR, "tool": "#d9822b"}


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}"


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [low, high] (about ``count`` of them; whole numbers
    only with ``integer``)."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    if integer:
        raw = max(raw, 1)
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if step * m >= raw)
    first = math.floor(low / step) * step
    return [round(first + i * step, 10) for i in range(int(math.ceil((high - first) / step)) + 1)]


def _frame(title: str, body: list[str], height: int = HEIGHT) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" font-family="sans-serif" font-size="11">'
            f'<title>{escape(title)}</title>'
            f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13" '
            f'font-weight="bold">{escape(title)}</text>' + "".join(body) + "</svg>")


def _y_axis(ticks: list[float], scale, label: str) -> list[str]:
    parts = [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#444"/>']
    for tick in ticks:
        y = scale(tick)
        parts.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                     f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{_fmt(tick)}</text>')
    parts.append(f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2})">{escape(label)}</text>')
    return parts


def _x_axis(ticks: list[float], scale, label: str, *, left: float = LEFT, right: float = WIDTH - RIGHT,
            height: int = HEIGHT) -> list[str]:
    base = height - BOTTOM
    parts = [f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#444"/>']
    for tick in ticks:
        x = scale(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#444"/>'
                     f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle">{_fmt(tick)}</text>')
    parts.append(f'<text x="{(left + right) / 2}" y="{height - 6}" '
                 f'text-anchor="middle">{escape(label)}</text>')
    return parts


def _linear(low: float, high: float, out_low: float, out_high: float):
    span = (high - low) or 1.0
    return lambda v: out_low + (v - low) / span * (out_high - out_low)


def empty(title: str, message: str = "no data") -> str:
    """A placeholder plot saying there is nothing to draw."""
    return _frame(title, [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
                          f'fill="#888">{escape(message)}</text>'], height=HEIGHT // 2)


def _bins(values: Sequence[float], bins: int) -> tuple[float, float, int, bool]:
    """(low, high, bins, integral): whole-number data with a small range gets one bin per
    value (at least five bins, so that a single value does not fill the plot)."""
    low, high = min(values), max(values)
    if all(float(v).is_integer() for v in values) and high - low < bins:
        pad = max(0, 5 - int(high - low + 1))
        low, high = low - pad // 2 - 0.5, high + pad - pad // 2 + 0.5
        return low, high, int(high - low), True
    if high == low:
        return low - 0.5, high + 0.5, 1, False
    return low, high, bins, False


def histogram(values: Sequence[float], title: str, xlabel: str, bins: int = 20) -> str:
    """Counts of ``values`` in equal-width bins over their range."""
    if not values:
        return empty(title)
    low, high, bins, integral = _bins(values, bins)
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    x = _linear(low, high, LEFT, WIDTH - RIGHT)
    y_ticks = nice_ticks(0, max(counts), integer=True)
    y = _linear(0, y_ticks[-1], HEIGHT - BOTTOM, TOP)
    bars = [f'<rect x="{x(low + i * width):.1f}" y="{y(c):.1f}" '
            f'width="{max(x(low + width) - x(low) - 1, 1):.1f}" height="{y(0) - y(c):.1f}" '
            f'fill="{COLOR}"><title>{_fmt(low + i * width)}..{_fmt(low + (i + 1) * width)}: '
            f'{c}</title></rect>' for i, c in enumerate(counts) if c]
    x_ticks = [t for t in nice_ticks(low, high, integer=integral) if low <= t <= high]
    return _frame(title, _y_axis(y_ticks, y, "count") + bars + _x_axis(x_ticks, x, xlabel))


def bar_chart(labels: list[str], values: list[float], title: str, *,
              max_value: float | None = None, value_format: str = "{:g}") -> str:
    """Horizontal bars, one per label, with the value printed beside each."""
    if not labels:
        return empty(title)
    row, label_width = 20, min(max(len(label) for label in labels) * 6.5 + 8, WIDTH / 2)
    height = TOP + row * len(labels) + 12
    top = max_value if max_value is not None else (max(values) or 1)
    x = _linear(0, top, label_width, WIDTH - RIGHT - 60)
    parts = []
    for i, (label, value) in enumerate(zip(labels, values)):
        y0 = TOP + i * row
        if max_value is not None:  # a track, so that 0% still shows
            parts.append(f'<rect x="{label_width}" y="{y0 + 3}" width="{x(top) - label_width:.1f}" '
                         f'height="{row - 6}" fill="#eee"/>')
        parts.append(f'<text x="{label_width - 6}" y="{y0 + 14}" text-anchor="end">'
                     f'{escape(label)}</text><rect x="{label_width}" y="{y0 + 3}" '
                     f'width="{max(x(value) - label_width, 0):.1f}" height="{row - 6}" '
                     f'fill="{COLOR}"/><text x="{x(value) + 4:.1f}" y="{y0 + 14}">'
                     f'{escape(value_format.format(value))}</text>')
    return _frame(title, parts, height=height)


def line_chart(xs: list[float], ys: list[float], title: str, xlabel: str, ylabel: str, *,
               integer: bool = False) -> str:
    """One line through the points (xs sorted ascending), with dots at each point;
    ``integer``: whole-number y ticks only."""
    if not xs:
        return empty(title)
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(min(0.0, min(ys)), max(ys), integer=integer)
    x = _linear(x_ticks[0], x_ticks[-1], LEFT, WIDTH - RIGHT)
    y = _linear(y_ticks[0], y_ticks[-1], HEIGHT - BOTTOM, TOP)
    points = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(xs, ys))
    dots = [f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="2" fill="{COLOR}"/>'
            for a, b in zip(xs, ys)] if len(xs) <= 200 else []
    line = f'<polyline points="{points}" fill="none" stroke="{COLOR}" stroke-width="2"/>'
    return _frame(title, _y_axis(y_ticks, y, ylabel) + _x_axis(x_ticks, x, xlabel) + [line] + dots)


def _short(label: str, limit: int = 22) -> str:
    return label if len(label) <= limit else label[:limit - 1] + "\u2026"


def _legend(legend: dict[str, str], left: float, y: float) -> list[str]:
    parts, x = [], left
    for kind, meaning in legend.items():
        parts.append(f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" '
                     f'fill="{TIMELINE_COLORS[kind]}"/><text x="{x + 14:.1f}" y="{y}">{escape(meaning)}</text>')
        x += 14 + len(meaning) * 6 + 16
    return parts


def timeline(rows: list[tuple[str, str, float, list[tuple[float, float, str, str]]]], title: str,
             xlabel: str, legend: dict[str, str]) -> str:
    """One time line per row on a shared axis from 0.

    A row is (label, note, end, bars): a gray track from 0 to ``end``, the note
    after it, and bars (start, end, kind, tooltip) on it, ``kind`` a key of
    ``TIMELINE_COLORS``. ``legend`` maps the kinds drawn to what they mean.
    """
    if not rows:
        return empty(title)
    row, top = 22, TOP + 18
    label_width = min(max(len(_short(label)) for label, *_ in rows) * 6.5 + 8, WIDTH / 3)
    height = top + row * len(rows) + BOTTOM
    high = max([end for _, _, end, _ in rows] + [b[1] for *_, bars in rows for b in bars])
    ticks = nice_ticks(0, high)
    right = WIDTH - RIGHT - 50  # room for the notes
    x = _linear(0, ticks[-1], label_width, right)
    parts = _legend(legend, label_width, TOP + 4)
    for tick in ticks:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{top}" x2="{x(tick):.1f}" y2="{height - BOTTOM}" '
                     f'stroke="#eee"/>')
    for i, (label, note, end, bars) in enumerate(rows):
        y0 = top + i * row
        parts.append(f'<g class="timeline-row"><text x="{label_width - 6}" y="{y0 + 15}" '
                     f'text-anchor="end">{escape(_short(label))}<title>{escape(label)}</title></text>'
                     f'<rect x="{label_width}" y="{y0 + 10}" width="{x(end) - label_width:.1f}" '
                     f'height="2" fill="#ccc"/>')
        for start, stop, kind, tooltip in bars:
            parts.append(f'<rect x="{x(start):.1f}" y="{y0 + 4}" width="{max(x(stop) - x(start), 1):.1f}" '
                         f'height="{row - 8}" fill="{TIMELINE_COLORS[kind]}">'
                         f'<title>{escape(tooltip)}</title></rect>')
        parts.append(f'<text x="{x(max([end] + [b[1] for b in bars])) + 4:.1f}" y="{y0 + 15}">'
                     f'{escape(note)}</text></g>')
    axis = _x_axis(ticks, x, xlabel, left=label_width, right=right, height=height)
    return _frame(title, parts + axis, height=height)
