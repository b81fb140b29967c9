"""The console's pictures, drawn on the server as SVG geometry (no script on the page):
a run's waterfall (its tree of spans against time) and the usage charts. Templates place
the numbers computed here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
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


def waterfall(tree: Span) -> Waterfall:
    """Each span of the run's tree (every event, and each branch of concurrent work) as
    a bar from its start to its end, a row each in the tree's order, named by its span
    (indented by its depth), coloured by its branch."""
    rows = tree.walk()[1:]
    if not rows:
        return Waterfall([], LABELS + WATERFALL_WIDTH, ROW, 0.0, [])
    origin = min(s.start for _, s in rows)
    end = max(s.end for _, s in rows)
    span_ms = max((end - origin).total_seconds() * 1000, 1.0)
    scale = (WATERFALL_WIDTH - 2) / span_ms
    bars = []
    for row, (depth, span) in enumerate(rows):
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
    return Waterfall(bars, LABELS + WATERFALL_WIDTH, len(bars) * ROW, span_ms, ticks)


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
