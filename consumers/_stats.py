"""Usage figures over the analytics views: calls, tokens, latency percentiles and error
rates of LLM calls, grouped by one dimension, for ``blackbox stats`` and plain SQL users.

Percentiles are exact (``percentile_cont`` over the calls in the window): the views keep
one row per call, so nothing is estimated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

GROUPINGS = {
    "model": "c.model",
    "provider": "c.provider",
    "agent": "c.agent_id",
    "tenant": "c.tenant_id",
    "code_version": "r.code_version",
    "finish_reason": "c.finish_reason",
    "prompt_version": "c.prompt_version",
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
               percentile_cont(0.99) WITHIN GROUP (ORDER BY c.latency_ms)
          FROM blackbox_views.llm_calls c
          LEFT JOIN blackbox_views.runs r ON r.run_id = c.run_id
         WHERE c.recorded_at >= :since
         GROUP BY 1
         ORDER BY 2 DESC, 1
        """
    )
    rows = []
    for group, calls, errors, prompt, completion, total, p50, p95, p99 in conn.execute(
        statement, {"since": since}
    ):
        rows.append(
            UsageRow(
                group=None if group is None else str(group),
                calls=int(calls),
                errors=int(errors),
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
                total_tokens=int(total),
                latency_p50_ms=p50,
                latency_p95_ms=p95,
                latency_p99_ms=p99,
            )
        )
    return rows
