"""The summary of an experiment: Student t quantiles, means with intervals, paired
differences, verdicts and regressions."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import pytest

from agent_blackbox.replayer._experiment_stats import (
    incomplete_beta,
    mean_interval,
    regressions,
    summarize,
    t_cdf,
    t_quantile,
)

# Student's t quantiles from printed tables (p, degrees of freedom, value).
TABLE = [
    (0.975, 1, 12.7062047362),
    (0.975, 2, 4.3026527297),
    (0.975, 5, 2.5705818366),
    (0.975, 9, 2.2621571628),
    (0.975, 29, 2.0452296421),
    (0.975, 49, 2.0095752371),
    (0.975, 120, 1.9799304050),
    (0.95, 5, 2.0150483733),
    (0.995, 10, 3.1692726726),
    (0.9, 3, 1.6377443537),
]


@pytest.mark.parametrize(("p", "df", "expected"), TABLE)
def test_t_quantile_matches_the_tables(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-8)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-8)
    assert t_cdf(expected, df) == pytest.approx(p, abs=1e-10)


def test_t_tends_to_the_normal_and_rejects_nonsense() -> None:
    normal = statistics.NormalDist().inv_cdf(0.975)
    assert t_quantile(0.975, 100_000) == pytest.approx(normal, abs=1e-4)
    assert t_quantile(0.5, 7) == 0.0
    for p, df in ((0.0, 3), (1.0, 3), (0.5, 0)):
        with pytest.raises(ValueError, match="t quantile"):
            t_quantile(p, df)


def test_incomplete_beta_known_values() -> None:
    # I_x(1, 1) = x; I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b.
    for x in (0.1, 0.5, 0.83):
        assert incomplete_beta(x, 1, 1) == pytest.approx(x, abs=1e-12)
        assert incomplete_beta(x, 3.5, 1) == pytest.approx(x**3.5, abs=1e-12)
        assert incomplete_beta(x, 1, 2.5) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-12)
    assert incomplete_beta(0, 2, 3) == 0.0
    assert incomplete_beta(1, 2, 3) == 1.0


def test_mean_interval() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    found = mean_interval(values, 0.95)
    half = 3.1824463053 * statistics.stdev(values) / 2  # t(0.975, 3) · s / √4
    assert found.value == 2.5
    assert found.low == pytest.approx(2.5 - half, abs=1e-9)
    assert found.high == pytest.approx(2.5 + half, abs=1e-9)
    assert mean_interval([], 0.95).value is None
    one = mean_interval([7.0], 0.95)
    assert (one.value, one.low, one.high) == (7.0, None, None)
    flat = mean_interval([0.5] * 10, 0.95)
    assert (flat.value, flat.low, flat.high) == (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class Row:
    run_id: str
    score: str
    evaluator: str
    lower_is_better: bool
    baseline: float | None
    variant: float | None


def test_the_difference_is_paired_run_by_run() -> None:
    # Runs differ a lot from each other; the variant adds 0.1 to each, give or take.
    before = [1.0, 5.0, 9.0, 13.0, 17.0]
    after = [1.11, 5.09, 9.1, 13.12, 17.08]
    rows = [
        Row(f"r{i}", "quality", "judge", False, b, a)
        for i, (b, a) in enumerate(zip(before, after, strict=True))
    ]
    [summary] = summarize(rows, confidence=0.95, tolerances={})
    differences = [a - b for a, b in zip(after, before, strict=True)]
    half = 2.7764451052 * statistics.stdev(differences) / math.sqrt(5)  # t(0.975, 4)
    assert summary.runs == 5
    assert summary.difference.value == pytest.approx(statistics.fmean(differences))
    assert summary.difference.low == pytest.approx(statistics.fmean(differences) - half)
    # Unpaired, the sides' intervals overlap almost wholly; paired, the gain is clear.
    assert summary.baseline.high is not None
    assert summary.variant.low is not None
    assert summary.variant.low < summary.baseline.high
    assert summary.verdict == "better"
    assert (summary.regressions, summary.improvements) == (0, 5)


def test_direction_tolerance_and_missing_scores() -> None:
    rows = [
        Row("a", "cost", "cost", True, 1.0, 1.5),
        Row("b", "cost", "cost", True, 1.0, 1.05),
        Row("c", "cost", "cost", True, 2.0, 1.0),
        Row("d", "cost", "cost", True, None, 1.0),  # no recorded score: left out
        Row("a", "exact", "equality", False, 1.0, 0.0),
        Row("b", "exact", "equality", False, 1.0, 1.0),
    ]
    found = {s.score: s for s in summarize(rows, confidence=0.9, tolerances={"cost": 0.1})}
    assert found["cost"].runs == 3
    assert (found["cost"].regressions, found["cost"].improvements) == (1, 1)
    assert found["cost"].verdict == "no clear change"
    assert found["exact"].lower_is_better is False
    listed = regressions(rows, tolerances={"cost": 0.1})
    assert [(r.run_id, r.score) for r in listed] == [("a", "cost"), ("a", "exact")]
    everything = regressions(rows, tolerances={})
    assert [(r.run_id, r.score) for r in everything] == [
        ("a", "cost"),
        ("a", "exact"),
        ("b", "cost"),
    ]


def test_too_few_runs_have_no_interval() -> None:
    [summary] = summarize([Row("a", "s", "e", False, 1.0, 0.0)], confidence=0.95, tolerances={})
    assert summary.verdict == "too few runs"
    assert summary.difference.value == -1.0
    assert summary.difference.low is None
    assert summary.to_dict()["better"] == "higher"
    [unscored] = summarize([Row("a", "t", "e", True, None, None)], confidence=0.95, tolerances={})
    assert (unscored.runs, unscored.verdict, unscored.difference.value) == (0, "not scored", None)
