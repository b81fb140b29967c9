"""The console's usage charts: a time axis to scale, a line broken where a group made no
call, and each point saying its group, time and value."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_blackbox.console._charts import (
    CHART_HEIGHT,
    CHART_WIDTH,
    charts,
    nice_ticks,
    tick_text,
    time_ticks,
)
from agent_blackbox.console._compare import compared, wilson
from agent_blackbox.console._templates import page_templates
from agent_blackbox.consumers import PromptVersionRow, UsagePoint, UsageRow

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


def test_ticks_take_1_2_5_steps_from_the_data() -> None:
    assert nice_ticks(8, least=4) == [0, 2, 4, 6, 8]
    assert nice_ticks(9, least=4) == [0, 5, 10]
    assert nice_ticks(150_000, least=4) == [0, 50_000, 100_000, 150_000]
    assert nice_ticks(0.013, least=0.01) == [0, 0.005, 0.01, 0.015]
    assert nice_ticks(0, least=0.01) == [0, 0.005, 0.01]  # nothing above zero: a small scale
    assert nice_ticks(1234, least=10) == [0, 500, 1000, 1500]


def test_tick_labels_carry_units_and_the_step_s_decimals() -> None:
    assert tick_text(0.005, 0.005, "error_rate") == "0.5 %"
    assert tick_text(0.01, 0.005, "error_rate") == "1.0 %"
    assert tick_text(1500, 500, "latency_p95_ms") == "1,500 ms"
    assert tick_text(0.005, 0.005, "cost_usd") == "$0.005"
    assert tick_text(100_000, 50_000, "total_tokens") == "100,000"


def test_time_ticks_fall_on_whole_minutes_at_most_six() -> None:
    start = T0 + timedelta(seconds=20)
    ticks = time_ticks(start, 30 * 60)
    assert [label for _, label in ticks] == ["10:05", "10:10", "10:15", "10:20", "10:25", "10:30"]
    assert ticks[0][0] == round(280 / 1800 * CHART_WIDTH, 1)


def test_no_errors_is_a_flat_line_at_zero_on_a_small_scale() -> None:
    points = [_point(0, "m", 4), _point(1, "m", 6)]
    error_rate = charts(points, bucket="minute")[-1]
    assert error_rate.top == "1.0 %"
    assert {d.y for d in error_rate.series[0].dots} == {float(CHART_HEIGHT)}


def test_series_drawing_the_same_values_differ_in_colour_pattern_and_dot_size() -> None:
    points = [_point(m, g, 5) for m in range(3) for g in ("a", "b")]
    first, second = charts(points, bucket="minute")[0].series
    assert first.segments == second.segments  # the same values …
    assert (first.slot, first.dash) != (second.slot, second.dash)  # … drawn apart
    assert second.radius < first.radius  # the first's dot rings the second's


def _svg(points: list[UsagePoint]) -> str:
    page = page_templates().get_template("charts.html")
    made = charts(points, bucket="minute")
    return page.render(
        charts=made, summary=[], total_cost=None, bucket="minute", by="model", groups=[]
    )


def test_the_svg_has_ticks_legend_title_and_escapes_names() -> None:
    hostile = '<script>x()</script>"&'
    html = _svg([_point(0, hostile, 4), _point(5, "v2", 8)])
    assert "<script>x()</script>" not in html
    assert "&lt;script&gt;x()&lt;/script&gt;&#34;&amp;" in html
    calls = html.split('<section class="chart">')[1]
    assert calls.count('class="tick"') == 5 + 6  # 0-8 by 2, and 10:00-10:05 each minute
    assert ">8</text>" in calls
    assert ">10:05</text>" in calls
    assert calls.count('class="key-entry"') == 2
    assert "<title id=" in calls
    assert "<desc id=" in calls
    assert "time (UTC)" in calls
    assert ">calls</text>" in calls
    assert 'stroke-dasharray="7 3"' in calls  # the second series' pattern


def test_wilson_interval_is_honest_at_zero_and_inside_0_1() -> None:
    none = wilson(0, 20)
    assert none.low == 0.0
    assert none.high is not None
    assert 0.16 < none.high < 0.17  # 0 of 20 is not a certainty of 0
    half = wilson(5, 10)
    assert half.low is not None
    assert half.high is not None
    assert abs(half.low - 0.2366) < 1e-3
    assert abs(half.high - 0.7634) < 1e-3
    assert wilson(0, 0).low is None


def test_compared_rows_carry_intervals() -> None:
    usage = UsageRow("v1", 10, 1, 0, 0, 0, 10.0, 20.0, 30.0)  # 1 failed call of 10
    row = PromptVersionRow("v1", usage, [0.01, 0.03], 2, 4, 3)
    (figures,) = compared([row])
    assert figures.errors.hits == 1
    assert figures.replays.value == 0.75
    assert figures.cost_per_run.value == 0.02
    assert figures.cost_per_run.low is not None
    assert figures.cost_per_run.low < 0.02
