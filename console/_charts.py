"""The console's pictures, drawn on the server as SVG geometry (no script on the page):
a run's waterfall and the usage charts. Templates place the numbers computed here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from agent_blackbox.consumers import RunEvent, UsagePoint

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
class Series:
    """One group's line: its name, its SVG points and its colour slot."""

    name: str
    points: str
    slot: int
    dots: list[tuple[float, float]]
    """The same points one by one (a single bucket draws no line)."""


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    series: list[Series]
    top: str
    first: str
    last: str


def charts(points: Sequence[UsagePoint]) -> list[Chart]:
    """Calls, tokens, latency p50 / p95 / p99 and error rate over time, a line per group."""
    if not points:
        return []
    buckets = sorted({p.bucket for p in points})
    groups = sorted({p.group or "(none)" for p in points})
    at = {(p.bucket, p.group or "(none)"): p for p in points}
    first, last = (
        buckets[0].isoformat(timespec="minutes"),
        buckets[-1].isoformat(timespec="minutes"),
    )

    def chart(title: str, value: str, unit: str = "") -> Chart:
        lines = {g: [_value(at.get((b, g)), value) for b in buckets] for g in groups}
        top = max((v for vs in lines.values() for v in vs if v is not None), default=0.0) or 1.0
        series = []
        for i, (g, vs) in enumerate(lines.items()):
            dots = _dots(vs, top, len(buckets))
            series.append(Series(g, " ".join(f"{x},{y}" for x, y in dots), i % LANES, dots))
        return Chart(title, series, f"{top:,.4g}{unit}", first, last)

    return [
        chart("LLM calls", "calls"),
        chart("Tokens", "total_tokens"),
        chart("Latency p50", "latency_p50_ms", " ms"),
        chart("Latency p95", "latency_p95_ms", " ms"),
        chart("Latency p99", "latency_p99_ms", " ms"),
        chart("Error rate", "error_rate"),
    ]


def _value(point: UsagePoint | None, name: str) -> float | None:
    if point is None:
        return None if name.startswith("latency") else 0.0
    if name == "error_rate":
        return point.errors / point.calls if point.calls else 0.0
    value = getattr(point, name)
    return None if value is None else float(value)


def _dots(values: Iterable[float | None], top: float, count: int) -> list[tuple[float, float]]:
    step = CHART_WIDTH / max(count - 1, 1)
    out = []
    for i, value in enumerate(values):
        if value is None:
            continue
        y = CHART_HEIGHT - (value / top) * (CHART_HEIGHT - 10)
        out.append((round(i * step, 1), round(y, 1)))
    return out
