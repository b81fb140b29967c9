"""The prompt-version comparison page's figures: per version, its calls' usage, its error
rate and replay pass rate with Wilson intervals, and its mean cost per run with a Student
t interval (all at 95 %)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent_blackbox.consumers import PromptVersionRow, UsageRow
from agent_blackbox.replayer import Mean, mean_interval

CONFIDENCE = 0.95
Z = 1.959963984540054
"""The standard normal quantile for a two-sided 95 % interval."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``hits`` of ``total`` and its Wilson interval (None when there is nothing to count)."""

    hits: int
    total: int
    low: float | None
    high: float | None

    @property
    def value(self) -> float | None:
        return self.hits / self.total if self.total else None


@dataclass(frozen=True, slots=True)
class VersionFigures:
    """One row of the comparison."""

    prompt_version: str
    usage: UsageRow
    runs: int
    errors: Rate
    replays: Rate
    cost_per_run: Mean


def wilson(hits: int, total: int, z: float = Z) -> Rate:
    """``hits`` of ``total`` with its Wilson score interval, which stays inside 0..1 and
    is honest at 0 or ``total`` hits (a rate of 0 of 20 is 0 to 16 %, not exactly 0).

    Raises:
        ValueError: ``hits`` is negative or above ``total``.
    """
    if not 0 <= hits <= total:
        raise ValueError(f"hits must be between 0 and total, not {hits} of {total}")
    if total == 0:
        return Rate(0, 0, None, None)
    p = hits / total
    spread = z * z / total
    centre = (p + spread / 2) / (1 + spread)
    half = z * math.sqrt(p * (1 - p) / total + spread / (4 * total)) / (1 + spread)
    return Rate(hits, total, max(0.0, centre - half), min(1.0, centre + half))


def compared(rows: list[PromptVersionRow]) -> list[VersionFigures]:
    """Each prompt version's figures, in the order given (most calls first)."""
    return [
        VersionFigures(
            prompt_version=row.prompt_version or "(none)",
            usage=row.usage,
            runs=row.runs,
            errors=wilson(row.usage.errors, row.usage.calls),
            replays=wilson(row.replays_passed, row.replays),
            cost_per_run=mean_interval(row.run_costs, CONFIDENCE),
        )
        for row in rows
    ]
