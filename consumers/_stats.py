"""Usage figures over the analytics views: calls, tokens, cost, latency percentiles and
error rates of LLM calls, grouped by one dimension, for ``blackbox stats`` and plain SQL
users.

Percentiles are exact (``percentile_cont`` over the calls in the window): the views keep
one row per call, so nothing is estimated. Costs are exact sums of ``numeric`` call
costs; a group's unpriced calls are counted beside its cost, never as zero.

A new dimension is one entry of :data:`GROUPINGS` (a column of the calls, or of their
run): every figure, the cost included, follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, text

GROUPINGS = {
    "model": "c.model",
    "provider": "c.provider",
    "agent": "c.agent_id",
    "tenant": "c.tenant_id",
    "code_version": "r.code_version",
    "finish_reason": "c.finish_reason",
    "prompt_version": "c.prompt_version",
    "run": "c.run_id",
    "session": "r.session_id",
    "user": "r.user_id",
}
"""What ``--by`` may name, and the column each groups on."""


@dataclass(frozen=True, slots=True)
class UsageRow:
    """The LLM calls of one group in the window."""

    group: str | None
    calls: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    cached_tokens: int = 0
    cost_usd: Decimal | None = None
    """The exact sum of the group's priced calls; None when none is priced."""
    unpriced_calls: int = 0
    """Calls that did not fail whose cost is unknown (no price for the model, or no
    usage reported): :attr:`cost_usd` leaves them out."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.calls if self.calls else 0.0


def llm_usage_txn(conn: Connection, *, by: str, since: datetime) -> list[UsageRow]:
    """The LLM calls recorded since ``since``, grouped by ``by`` (a key of
    :data:`GROUPINGS`), most calls first.

    Raises:
        ValueError: ``by`` names no grouping.
    """
    column = GROUPINGS.get(by)
    if column is None:
        raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(GROUPINGS)}")
    statement = text(
        f"""
        SELECT {column} AS grp, count(*), count(c.error_class),
               coalesce(sum(c.prompt_tokens), 0), coalesce(sum(c.completion_tokens), 0),
               coalesce(sum(c.total_tokens), 0),
               percentile_cont(0.50) WITHIN GROUP (ORDER BY c.latency_ms),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY c.latency_ms),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY c.latency_ms),
               coalesce(sum(c.cached_tokens), 0), sum(c.cost_usd),
               count(*) FILTER (WHERE c.cost_usd IS NULL AND c.error_class IS NULL)
          FROM blackbox_views.llm_calls c
          LEFT JOIN blackbox_views.runs r ON r.run_id = c.run_id
         WHERE c.recorded_at >= :since
         GROUP BY 1
         ORDER BY 2 DESC, 1
        """
    )
    return [_usage_row(row) for row in conn.execute(statement, {"since": since})]


def _usage_row(row: Any) -> UsageRow:
    group, calls, errors, prompt, completion, total, p50, p95, p99, cached, cost, unpriced = row
    return UsageRow(
        group=None if group is None else str(group),
        calls=int(calls),
        errors=int(errors),
        prompt_tokens=int(prompt),
        completion_tokens=int(completion),
        total_tokens=int(total),
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        cached_tokens=int(cached),
        cost_usd=None if cost is None else Decimal(cost),
        unpriced_calls=int(unpriced),
    )
