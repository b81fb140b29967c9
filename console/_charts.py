"""The console's pictures, drawn on the server as SVG geometry (no script on the page):
a run's waterfall and the usage charts. Templates place the numbers computed here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from agent_blackbox.consumers import RunEvent, UsagePoint, dollars_text

WATERFALL_WIDTH = 900
LABELS = 170
"""Width of the column of event names left of the bars."""
ROW = 12
LANES = 6
"""Branches of concurrent work are told apart by this many colours, in turn."""


@dataclass(frozen=True, slots=True)
class Bar:
    """One event on the waterfall: where it starts and how wide it is, in pixels."""

    sequence: int
    event_type: str
    x: float
    width: float
    y: int
    lane: int
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


def waterfall(events: Sequence[RunEvent]) -> Waterfall:
    """Each event as a bar from its start (its time minus its latency, for a call) to
    its end, on a row of its own in sequence order, coloured by its branch."""
    if not events:
        return Waterfall([], LABELS + WATERFALL_WIDTH, ROW, 0.0, [])
    starts = [_start(e) for e in events]
    origin = min(starts)
    end = max(e.recorded_at for e in events)
    span_ms = max((end - origin).total_seconds() * 1000, 1.0)
    scale = (WATERFALL_WIDTH - 2) / span_ms
    bars = []
    for row, (event, start) in enumerate(zip(events, starts, strict=True)):
        x = (start - origin).total_seconds() * 1000 * scale
        width = max((event.recorded_at - start).total_seconds() * 1000 * scale, 2.0)
        latency = "" if event.latency_ms is None else f", {event.latency_ms:.0f} ms"
        bars.append(
            Bar(
                sequence=event.sequence,
                event_type=event.event_type,
                x=round(LABELS + x, 1),
                width=round(min(width, WATERFALL_WIDTH - x), 1),
                y=row * ROW,
                lane=event.branch % LANES,
                branch=event.branch,
                label=f"#{event.sequence} {event.event_type}{latency}",
                name=f"{event.sequence} {event.event_type}",
            )
        )
    ticks = [
        (round(LABELS + i * (WATERFALL_WIDTH - 2) / 4, 1), _ms(span_ms * i / 4)) for i in range(5)
    ]
    return Waterfall(bars, LABELS + WATERFALL_WIDTH, len(bars) * ROW, span_ms, ticks)


def _start(event: RunEvent) -> datetime:
    if event.latency_ms is None or event.latency_ms < 0:
        return event.recorded_at
    return event.recorded_at - timedelta(milliseconds=event.latency_ms)


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


CHART_WIDTH = 720
CHART_HEIGHT = 180


@dataclass(frozen=True, slots=True)
class Dot:
    """One bucket of one group: where it is drawn and what hovering it says."""

    x: float
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class Series:
    """One group's line: its name, its runs of consecutive buckets (a bucket without
    calls breaks the line rather than drawing a zero), its dots and its colour slot."""

    name: str
    segments: list[str]
    dots: list[Dot]
    slot: int


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    series: list[Series]
    top: str
    first: str
    last: str


_CHARTS = (
    ("LLM calls", "calls", ""),
    ("Tokens", "total_tokens", ""),
    ("Cost", "cost_usd", ""),
    ("Latency p50", "latency_p50_ms", " ms"),
    ("Latency p95", "latency_p95_ms", " ms"),
    ("Latency p99", "latency_p99_ms", " ms"),
    ("Error rate", "error_rate", ""),
)


def charts(points: Sequence[UsagePoint], *, bucket: str) -> list[Chart]:
    """Calls, tokens, cost, latency p50 / p95 / p99 and error rate over time, a line per
    group (a bucket none of whose calls is priced draws no cost point).

    The time axis is to scale (from the first bucket to the last); a group's line is
    broken where it has no calls in a bucket.
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
    made = []
    for title, name, unit in _CHARTS:
        values = {g: [(p, _value(p, name)) for p in rows] for g, rows in by_group.items()}
        top = max((v for rows in values.values() for _, v in rows if v is not None), default=0)
        top = top or 1.0
        series = []
        for slot, (group, rows) in enumerate(values.items()):
            dots, segments, run = [], [], []
            previous = None
            for point, value in rows:
                if value is None:
                    continue
                x = round((point.bucket - first).total_seconds() / span * CHART_WIDTH, 1)
                y = round(CHART_HEIGHT - value / top * (CHART_HEIGHT - 10), 1)
                if previous is not None and point.bucket - previous > step and run:
                    segments.append(" ".join(run))
                    run = []
                run.append(f"{x},{y}")
                previous = point.bucket
                when = point.bucket.strftime("%Y-%m-%d %H:%M")
                dots.append(Dot(x, y, f"{group} · {when} UTC · {_shown(value, name)}{unit}"))
            if run:
                segments.append(" ".join(run))
            series.append(Series(group, segments, dots, slot % LANES))
        made.append(
            Chart(
                title,
                series,
                f"{_shown(top, name)}{unit}",
                first.strftime("%Y-%m-%d %H:%M UTC"),
                last.strftime("%Y-%m-%d %H:%M UTC"),
            )
        )
    return made


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
