"""The console's usage charts: a time axis to scale, a line broken where a group made no
call, and each point saying its group, time and value."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_blackbox.console._charts import CHART_WIDTH, charts
from agent_blackbox.consumers import UsagePoint

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _point(minute: int, group: str, calls: int) -> UsagePoint:
    at = T0 + timedelta(minutes=minute)
    return UsagePoint(at, group, calls, 0, calls * 100, 20.0, 40.0, 60.0)


def test_the_time_axis_is_to_scale_and_a_quiet_minute_breaks_the_line() -> None:
    points = [_point(0, "v1", 4), _point(1, "v1", 6), _point(10, "v1", 2), _point(10, "v2", 8)]
    calls = charts(points, bucket="minute")[0]
    v1, v2 = calls.series
    assert [d.x for d in v1.dots] == [0.0, CHART_WIDTH / 10, CHART_WIDTH]
    assert len(v1.segments) == 2  # minutes 0-1, then 10: no zero drawn between
    assert [d.x for d in v2.dots] == [CHART_WIDTH]
    assert v1.dots[1].label == "v1 · 2026-12-01 10:01 UTC · 6"
    assert calls.top == "8"


def test_large_figures_read_with_separators() -> None:
    tokens = charts([_point(0, "m", 1500)], bucket="hour")[1]
    assert tokens.top == "150,000"
