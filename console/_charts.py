"""The console's pictures, drawn on the server as SVG geometry (no script on the page):
a run's waterfall (its tree of spans against time) and the usage charts. Templates place
the numbers computed here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from agent_blackbox.console._tree import Span
from agent_blackbox.consumers import UsagePoint, dollars_text

WATERFALL_WIDTH = 900
LABELS = 220
"""Width of the column of span names left of the bars."""
ROW = 12
LANES = 6
"""Branches of concurrent work are told apart by this many colours, in turn."""
LABEL_CHAR = 6.1
"""Width of one character of a row's name (10 px monospace), to fit names in LABELS."""
INDENT = 8
"""How far a span's name is indented per level of the tree."""
WATERFALL_BARS = 1_000
"""Bars drawn at most: past this a waterfall is taller than anyone scrolls (12,000 px),
and the tree above it lists every span anyway."""


@dataclass(frozen=True, slots=True)
class Bar:
    """One span on the waterfall: where it starts and how wide it is, in pixels."""

    sequence: int | None
    css: str
    x: float
    width: float
    y: int
    indent: int
    branch: int
    label: str
    name: str


@dataclass(frozen=True, slots=True)
class Waterfall:
    bars: list[Bar]
    width: int
    height: int
    span_ms: float
    ticks: list[tuple[float, str]]
    spans: int = 0
    """Spans of the tree in all: more than ``bars`` when the waterfall was cut."""


def waterfall(tree: Span, *, most: int = WATERFALL_BARS) -> Waterfall:
    """Each span of the run's tree (every event, and each branch of concurrent work) as
    a bar from its start to its end, a row each in the tree's order, named by its span
    (indented by its depth), coloured by its branch; the first ``most`` spans, on the
    time axis of the whole run."""
    rows = tree.walk()[1:]
    if not rows:
        return Waterfall([], LABELS + WATERFALL_WIDTH, ROW, 0.0, [])
    origin = min(s.start for _, s in rows)
    end = max(s.end for _, s in rows)
    span_ms = max((end - origin).total_seconds() * 1000, 1.0)
    scale = (WATERFALL_WIDTH - 2) / span_ms
    bars = []
    for row, (depth, span) in enumerate(rows[:most]):
        x = (span.start - origin).total_seconds() * 1000 * scale
        width = max(span.duration_ms * scale, 2.0)
        indent = 4 + (depth - 1) * INDENT
        bars.append(
            Bar(
                sequence=span.sequence,
                css=_bar_class(span),
                x=round(LABELS + x, 1),
                width=round(min(width, WATERFALL_WIDTH - x), 1),
                y=row * ROW,
                indent=indent,
                branch=span.branch,
                label=_bar_label(span),
                name=fitted(span.name, int((LABELS - 6 - indent) / LABEL_CHAR)),
            )
        )
    ticks = [
        (round(LABELS + i * (WATERFALL_WIDTH - 2) / 4, 1), _ms(span_ms * i / 4)) for i in range(5)
    ]
    return Waterfall(bars, LABELS + WATERFALL_WIDTH, len(bars) * ROW, span_ms, ticks, len(rows))


def _bar_class(span: Span) -> str:
    kind = "branch" if span.sequence is None else f"k-{span.kind.lower()}"
    return f"bar b{span.branch % LANES} {kind}" + (" err" if span.error else "")


def _bar_label(span: Span) -> str:
    where = "" if span.sequence is None else f"#{span.sequence} "
    words = [f"{where}{span.kind} {span.name}, {span.duration_ms:.0f} ms"]
    if span.branch:
        words.append(f"branch {span.branch}")
    if span.error:
        words.append(span.error)
    return " · ".join(words)


def fitted(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: cut after the last whole word that
    fits (or the last ``_``, ``-``, ``.`` or ``/`` part of one long word) and an
    ellipsis; a single part longer than that is cut where it must."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - 1, 1)]
    for marks in (" ", "_-./"):
        cut = max(head.rfind(mark) for mark in marks)
        if cut > limit // 3:
            return head[:cut].rstrip(" _-./") + "…"
    return head + "…"


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


CHART_WIDTH = 720
"""Width of a usage chart's plot area (its axes' labels are outside it)."""
CHART_HEIGHT = 180
MARGIN_LEFT = 76
"""Room left of the plot for the value axis's tick labels and its title."""
MARGIN_TOP = 10
MARGIN_RIGHT = 16
MARGIN_BOTTOM = 40
"""Room under the plot for the time axis's tick labels and its title."""
LEGEND_ROW = 18
LEGEND_KEY = 180
"""Width of one legend entry (a line sample and a name of up to 24 characters)."""
DASHES = ("", "7 3", "2 3", "9 3 2 3", "4 4", "1 3")
"""Line patterns, so two series that draw the same values stay told apart (with colour)."""
TIME_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800)
"""Seconds between time ticks, the smallest that keeps at most six ticks is used."""


@dataclass(frozen=True, slots=True)
class Dot:
    """One bucket of one group: where it is drawn and what hovering it says."""

    x: float
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class Series:
    """One group's line: its name, its runs of consecutive buckets (a bucket without
    calls breaks the line rather than drawing a zero), its dots, its colour slot, its
    line pattern and its dots' radius (smaller for later series, so an earlier dot under
    a later one shows as a ring)."""

    name: str
    segments: list[str]
    dots: list[Dot]
    slot: int
    dash: str = ""
    radius: float = 3.0


@dataclass(frozen=True, slots=True)
class Key:
    """One legend entry, placed under the time axis."""

    x: float
    y: float
    name: str
    slot: int
    dash: str


@dataclass(frozen=True, slots=True)
class Chart:
    """A usage chart: its series in plot coordinates, its axes' ticks (position, label
    with its unit), its legend, and a sentence describing it for screen readers."""

    title: str
    series: list[Series]
    top: str
    first: str
    last: str
    y_title: str = ""
    y_ticks: list[tuple[float, str]] | None = None
    x_ticks: list[tuple[float, str]] | None = None
    keys: list[Key] | None = None
    width: int = CHART_WIDTH + MARGIN_LEFT + MARGIN_RIGHT
    height: int = CHART_HEIGHT + MARGIN_TOP + MARGIN_BOTTOM
    desc: str = ""


_CHARTS = (
    # title, field, axis title, the least top of the scale (so all-zero data is flat at 0)
    ("LLM calls", "calls", "calls", 4.0),
    ("Tokens", "total_tokens", "tokens", 4.0),
    ("Cost", "cost_usd", "cost (USD)", 0.01),
    ("Latency p50", "latency_p50_ms", "latency", 10.0),
    ("Latency p95", "latency_p95_ms", "latency", 10.0),
    ("Latency p99", "latency_p99_ms", "latency", 10.0),
    ("Error rate", "error_rate", "errors / calls", 0.01),
)


def nice_ticks(high: float, *, least: float, count: int = 4) -> list[float]:
    """Ticks from 0 to the first multiple of a 1-2-5 step at or above ``high``.

    Args:
        high: the largest value drawn (0 or less when nothing is above zero).
        least: the smallest top the scale may have, so a series of zeros is drawn flat
            at the bottom of a small scale rather than stretched over a made-up one.
        count: about how many steps the axis should have (at most ``2 * count``).
    """
    high = max(high, least)
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    steps = math.ceil(high / step - 1e-9)
    return [round(i * step, 12) for i in range(steps + 1)]


def tick_text(value: float, step: float, name: str) -> str:
    """A tick's label with its unit, with as many decimals as the step needs."""
    scale = 100.0 if name == "error_rate" else 1.0
    digits = max(0, math.ceil(-math.log10(step * scale) - 1e-9)) if step else 0
    number = f"{value * scale:,.{digits}f}"
    if name == "error_rate":
        return f"{number} %"
    if name == "cost_usd":
        return f"${value:,.{max(digits, 2)}f}"
    if name.startswith("latency"):
        return f"{number} ms"
    return number


def time_ticks(first: datetime, span: float) -> list[tuple[float, str]]:
    """Ticks on the time axis at whole minutes or hours (UTC) from ``first`` over ``span``
    seconds, at most six, each at its x in the plot."""
    step = next((s for s in TIME_STEPS if span / s <= 6), TIME_STEPS[-1])
    start = first.timestamp()
    at = math.ceil(start / step) * step
    shape = "%m-%d %H:%M" if span >= 86400 else "%H:%M"
    ticks = []
    while at <= start + span + 1e-6:
        x = round((at - start) / span * CHART_WIDTH, 1)
        ticks.append((x, datetime.fromtimestamp(at, UTC).strftime(shape)))
        at += step
    return ticks


def charts(points: Sequence[UsagePoint], *, bucket: str) -> list[Chart]:
    """Calls, tokens, cost, latency p50 / p95 / p99 and error rate over time, a line per
    group (a bucket none of whose calls is priced draws no cost point).

    The time axis is to scale (from the first bucket to the last); a group's line is
    broken where it has no calls in a bucket. The value axis runs from 0 to a 1-2-5 step
    above the largest value drawn.
    """
    if not points:
        return []
    step = timedelta(minutes=1) if bucket == "minute" else timedelta(hours=1)
    first = min(p.bucket for p in points)
    last = max(p.bucket for p in points)
    span = max((last - first).total_seconds(), step.total_seconds())
    groups = sorted({p.group or "(none)" for p in points})
    by_group: dict[str, list[UsagePoint]] = {g: [] for g in groups}
    for point in sorted(points, key=lambda p: p.bucket):
        by_group[point.group or "(none)"].append(point)
    frame = _Frame(first, span, step, bucket)
    return [frame.chart(spec, by_group) for spec in _CHARTS]


@dataclass(frozen=True, slots=True)
class _Frame:
    """The time window every chart of the page shares."""

    first: datetime
    span: float
    step: timedelta
    bucket: str

    def chart(
        self, spec: tuple[str, str, str, float], by_group: dict[str, list[UsagePoint]]
    ) -> Chart:
        title, name, y_title, least = spec
        values = {g: [(p, _value(p, name)) for p in rows] for g, rows in by_group.items()}
        high = max((v for rows in values.values() for _, v in rows if v is not None), default=0)
        ticks = nice_ticks(high, least=least)
        top = ticks[-1]
        series = [
            self._series(group, rows, slot, top, name)
            for slot, (group, rows) in enumerate(values.items())
        ]
        y_ticks = [
            (round(CHART_HEIGHT - t / top * CHART_HEIGHT, 1), tick_text(t, ticks[1], name))
            for t in ticks
        ]
        first_text = self.first.strftime("%Y-%m-%d %H:%M UTC")
        last_text = (self.first + timedelta(seconds=self.span)).strftime("%Y-%m-%d %H:%M UTC")
        keys = _legend(series)
        rows = (len(keys) + 3) // 4
        return Chart(
            title,
            series,
            tick_text(top, ticks[1], name),
            first_text,
            last_text,
            y_title=y_title,
            y_ticks=y_ticks,
            x_ticks=time_ticks(self.first, self.span),
            keys=keys,
            height=CHART_HEIGHT + MARGIN_TOP + MARGIN_BOTTOM + rows * LEGEND_ROW + 4,
            desc=(
                f"{title} per {self.bucket} from {first_text} to {last_text}, one line per"
                f" group ({', '.join(s.name for s in series)}); the largest value is"
                f" {_shown(high, name)}{' ms' if name.startswith('latency') else ''}."
            ),
        )

    def _series(
        self,
        group: str,
        rows: list[tuple[UsagePoint, float | None]],
        slot: int,
        top: float,
        name: str,
    ) -> Series:
        unit = " ms" if name.startswith("latency") else ""
        dots, segments, run = [], [], []
        previous = None
        for point, value in rows:
            if value is None:
                continue
            x = round((point.bucket - self.first).total_seconds() / self.span * CHART_WIDTH, 1)
            y = round(CHART_HEIGHT - value / top * CHART_HEIGHT, 1)
            if previous is not None and point.bucket - previous > self.step and run:
                segments.append(" ".join(run))
                run = []
            run.append(f"{x},{y}")
            previous = point.bucket
            when = point.bucket.strftime("%Y-%m-%d %H:%M")
            dots.append(Dot(x, y, f"{group} · {when} UTC · {_shown(value, name)}{unit}"))
        if run:
            segments.append(" ".join(run))
        dash = DASHES[(slot + slot // LANES) % len(DASHES)]
        radius = max(5.0 - (slot % LANES), 1.5)
        return Series(group, segments, dots, slot % LANES, dash, radius)


def _legend(series: list[Series]) -> list[Key]:
    """Legend entries, four a row under the time axis's title."""
    below = CHART_HEIGHT + MARGIN_BOTTOM + 2
    return [
        Key(
            float((i % 4) * LEGEND_KEY),
            float(below + (i // 4) * LEGEND_ROW),
            fitted(s.name, 24),
            s.slot,
            s.dash,
        )
        for i, s in enumerate(series)
    ]


def _shown(value: float, name: str) -> str:
    if name == "error_rate":
        return f"{value * 100:.1f} %"
    if name == "cost_usd":
        return dollars_text(Decimal(repr(value)))
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _value(point: UsagePoint, name: str) -> float | None:
    if name == "error_rate":
        return point.errors / point.calls if point.calls else 0.0
    value = getattr(point, name)
    return None if value is None else float(value)
