"""A series as an SVG line chart, computed here: the page needs no chart library nor script.

:func:`chart` turns ``(time, value)`` points over the last hour into the
coordinates of a polyline and an area in a fixed view box, plus the labels
of the axes; the template draws them (``templates/_chart.html``). Numbers
only: nothing of the data reaches the SVG as text but the formatted labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 600
HEIGHT = 170
_TOP = 26
_BOTTOM = 26
_LEFT = 4
_RIGHT = 4


@dataclass(frozen=True)
class Chart:
    """What the template draws.

    Attributes:
        title: the chart's name.
        unit: what a value counts (``records``, ``/s``).
        line: the polyline's points, ``"x,y x,y ..."``; empty with fewer than two samples.
        area: the same closed along the bottom, for the fill.
        top: the value at the top of the view box (a round number).
        latest: the newest value, formatted.
        span: the minutes the x axis covers.
    """

    title: str
    unit: str
    line: str
    area: str
    top: str
    latest: str
    span: int
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def baseline(self) -> int:
        """The y of zero."""
        return self.height - _BOTTOM


def chart_span(sampled: float, most: float = 3600.0) -> float:
    """The seconds a chart's x axis covers: what was sampled, in 5 minutes steps, up to ``most``.

    A console that started a minute ago draws its minute over 5 minutes,
    not over an hour where it would be a sliver at the right edge.
    """
    step = 300.0
    return min(most, max(step, math.ceil(sampled / step) * step))


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return step * power
    return 10 * power


def number(value: float) -> str:
    """``0``, ``7``, ``3.5``, ``12k``, ``1.2M``: short enough for an axis."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M".replace(".0M", "M")
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def chart(
    title: str, unit: str, points: Sequence[tuple[float, float]], now: float, span: float = 3600.0
) -> Chart:
    """Lay out ``points`` ``(seconds since the epoch, value)`` over ``span`` seconds to ``now``."""
    shown = [(t, v) for t, v in points if now - span <= t <= now]
    top = nice_ceiling(max((v for _, v in shown), default=0.0))
    inner_w = WIDTH - _LEFT - _RIGHT
    inner_h = HEIGHT - _TOP - _BOTTOM

    def xy(t: float, v: float) -> str:
        x = _LEFT + inner_w * (1 - (now - t) / span)
        y = _TOP + inner_h * (1 - v / top)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(t, v) for t, v in shown) if len(shown) > 1 else ""
    area = ""
    if line:
        first, last = xy(shown[0][0], 0), xy(shown[-1][0], 0)
        area = f"{first} {line} {last}"
    latest = number(shown[-1][1]) if shown else "-"
    return Chart(title, unit, line, area, number(top), latest, round(span / 60))
