"""An experiment's summary: per score, the mean of each side and of the paired
difference, each with a Student t confidence interval, and the runs that regressed.

The method (:data:`METHOD`): a score is summarised over the runs where both the
recorded run and its variant have it. Each side's mean gets a one-sample t interval;
the difference (variant minus recorded, run by run) gets a paired t interval: the mean
of the per-run differences ± t(1 - α/2, n - 1) · s / √n, s their sample standard
deviation. Pairing removes what varies between runs (a long ticket costs more under
either prompt), so the difference's interval is the one to read. No interval is given
for fewer than two runs.

The Student t quantile is computed here (the regularised incomplete beta function by
its continued fraction, inverted by bisection), exact to about 1e-10: no statistics
library is needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

METHOD = (
    "Student t intervals over the runs both sides scored: one-sample for each side's "
    "mean, paired for the difference (variant minus recorded, run by run)"
)

Verdict = Literal["better", "worse", "no clear change", "too few runs", "not scored"]


class Paired(Protocol):
    """One score of one run on both sides (a stored row, or an experiment's result)."""

    @property
    def run_id(self) -> str: ...
    @property
    def score(self) -> str: ...
    @property
    def evaluator(self) -> str: ...
    @property
    def lower_is_better(self) -> bool: ...
    @property
    def baseline(self) -> float | None: ...
    @property
    def variant(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Mean:
    """A mean and its confidence interval (None for fewer than two values)."""

    value: float | None
    low: float | None = None
    high: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"mean": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True, slots=True)
class ScoreSummary:
    """One score over an experiment's runs."""

    score: str
    evaluator: str
    lower_is_better: bool
    runs: int
    """Runs both sides scored: the n of every mean and interval."""
    baseline: Mean
    variant: Mean
    difference: Mean
    """Variant minus recorded, paired by run."""
    verdict: Verdict
    """``better`` or ``worse`` when the difference's interval lies wholly on that side of
    zero, else ``no clear change`` (``too few runs`` below two, ``not scored`` when no
    run has the score on both sides)."""
    regressions: int
    improvements: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "evaluator": self.evaluator,
            "better": "lower" if self.lower_is_better else "higher",
            "runs": self.runs,
            "baseline": self.baseline.to_dict(),
            "variant": self.variant.to_dict(),
            "difference": self.difference.to_dict(),
            "verdict": self.verdict,
            "regressions": self.regressions,
            "improvements": self.improvements,
        }


@dataclass(frozen=True, slots=True)
class Regression:
    """A run whose variant scored worse than the recorded run by more than the score's
    tolerance."""

    run_id: str
    score: str
    baseline: float
    variant: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "score": self.score,
            "baseline": self.baseline,
            "variant": self.variant,
            "change": self.variant - self.baseline,
        }


def summarize(
    rows: Iterable[Paired], *, confidence: float, tolerances: Mapping[str, float]
) -> list[ScoreSummary]:
    """Each score's summary (in name order) over the rows where both sides scored; a
    score no run has on both sides is summed up as ``not scored``, so it is not missed."""
    by_score: dict[str, list[Paired]] = {}
    first: dict[str, Paired] = {}
    for row in rows:
        both = row.baseline is not None and row.variant is not None
        by_score.setdefault(row.score, []).extend([row] if both else [])
        first.setdefault(row.score, row)
    return [
        _summary(first[score], by_score[score], confidence, tolerances.get(score, 0.0))
        for score in sorted(by_score)
    ]


def _summary(
    first: Paired, rows: Sequence[Paired], confidence: float, tolerance: float
) -> ScoreSummary:
    before = [float(r.baseline or 0.0) for r in rows]
    after = [float(r.variant or 0.0) for r in rows]
    lower = first.lower_is_better
    difference = mean_interval([a - b for a, b in zip(after, before, strict=True)], confidence)
    worse = sum(_worse(b, a, lower, tolerance) for b, a in zip(before, after, strict=True))
    better = sum(_worse(a, b, lower, tolerance) for b, a in zip(before, after, strict=True))
    return ScoreSummary(
        score=first.score,
        evaluator=first.evaluator,
        lower_is_better=lower,
        runs=len(rows),
        baseline=mean_interval(before, confidence),
        variant=mean_interval(after, confidence),
        difference=difference,
        verdict=_verdict(difference, lower),
        regressions=worse,
        improvements=better,
    )


def _worse(before: float, after: float, lower_is_better: bool, tolerance: float) -> bool:
    change = after - before
    return change > tolerance if lower_is_better else change < -tolerance


def _verdict(difference: Mean, lower_is_better: bool) -> Verdict:
    if difference.value is None:
        return "not scored"
    if difference.low is None or difference.high is None:
        return "too few runs"
    if difference.low > 0:
        return "worse" if lower_is_better else "better"
    if difference.high < 0:
        return "better" if lower_is_better else "worse"
    return "no clear change"


def regressions(rows: Iterable[Paired], *, tolerances: Mapping[str, float]) -> list[Regression]:
    """The runs, score by score, whose variant did worse than the recorded run by more
    than the score's tolerance (0 unless given), by run then score."""
    found = [
        Regression(r.run_id, r.score, r.baseline, r.variant)
        for r in rows
        if r.baseline is not None
        and r.variant is not None
        and _worse(r.baseline, r.variant, r.lower_is_better, tolerances.get(r.score, 0.0))
    ]
    return sorted(found, key=lambda r: (r.run_id, r.score))


def mean_interval(values: Sequence[float], confidence: float) -> Mean:
    """The mean of ``values`` with its Student t interval at ``confidence``; no interval
    for fewer than two values, and none at all for no value."""
    n = len(values)
    if n == 0:
        return Mean(None)
    mean = math.fsum(values) / n
    if n < 2:
        return Mean(mean)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * spread / math.sqrt(n)
    return Mean(mean, mean - half, mean + half)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Raises:
        ValueError: ``p`` is not strictly between 0 and 1, or ``df`` is below 1.
    """
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and df >= 1, not p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):  # bisection: each step halves the bracket
        middle = (low + high) / 2
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * incomplete_beta(x, df / 2, 0.5)
    return 1 - tail if t >= 0 else tail


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for 0 <= x <= 1."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    # The continued fraction converges fast below the mean of the distribution; above
    # it, the symmetry I_x(a, b) = 1 - I_(1-x)(b, a) brings x below.
    if x > (a + 1) / (a + b + 2):
        return 1 - incomplete_beta(1 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b) - math.log(a)
    return math.exp(log_front) * _fraction(x, a, b)


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _fraction(x: float, a: float, b: float) -> float:
    """The continued fraction 1 / (1 + d1 / (1 + d2 / (1 + ...))) of I_x(a, b), by the
    modified Lentz method; its terms alternate d(2m+1) and d(2m)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 1000):
        for term in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + term * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + term / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return result
