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


def llm_usage_txn(
    conn: Connection,
    *,
    by: str,
    since: datetime,
    agent: str | None = None,
    include_unverified: bool = False,
) -> list[UsageRow]:
    """The LLM calls recorded since ``since`` (of ``agent`` only, when given), grouped by
    ``by`` (a key of :data:`GROUPINGS`), most calls first. Calls the write side does not
    vouch for (``llm_calls.unverified``) are left out unless ``include_unverified``.

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
           AND (CAST(:agent AS text) IS NULL OR c.agent_id = :agent)
           AND (:unverified OR c.unverified IS NULL)
         GROUP BY 1
         ORDER BY 2 DESC, 1
        """
    )
    where = {"since": since, "agent": agent, "unverified": include_unverified}
    return [_usage_row(row) for row in conn.execute(statement, where)]


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


@dataclass(frozen=True, slots=True)
class PromptVersionRow:
    """One prompt version's LLM calls, what its runs cost one by one, and its replays."""

    prompt_version: str | None
    usage: UsageRow
    run_costs: list[float]
    """Each priced run's cost in dollars (a run none of whose calls is priced is left out)."""
    runs: int
    replays: int
    replays_passed: int


def prompt_versions_txn(
    conn: Connection, *, since: datetime, agent: str | None = None
) -> list[PromptVersionRow]:
    """Per prompt version (of the runs, or of the call where the run has none), for the
    runs started and calls recorded since ``since``, of ``agent`` only when given: the
    calls' usage as :func:`llm_usage_txn` counts it, the cost of each run, and how many
    replays of its runs there were and passed. Most calls first."""
    where = {"since": since, "agent": agent}
    rows = llm_usage_txn(conn, by="prompt_version", since=since, agent=agent)
    runs = text(
        """
        SELECT r.prompt_version, r.cost_usd,
               (SELECT count(*) FROM blackbox_views.replay_results x WHERE x.run_id = r.run_id),
               (SELECT count(*) FROM blackbox_views.replay_results x
                 WHERE x.run_id = r.run_id AND x.passed)
          FROM blackbox_views.run_rollups r
         WHERE r.started_at >= :since AND (CAST(:agent AS text) IS NULL OR r.agent_id = :agent)
        """
    )
    per_run: dict[str | None, list[tuple[Decimal | None, int, int]]] = {}
    for version, cost, replays, passed in conn.execute(runs, where):
        per_run.setdefault(version, []).append((cost, int(replays), int(passed)))
    return [_prompt_version_row(u, per_run.get(u.group, [])) for u in rows]


def _prompt_version_row(
    usage: UsageRow, runs: list[tuple[Decimal | None, int, int]]
) -> PromptVersionRow:
    return PromptVersionRow(
        prompt_version=usage.group,
        usage=usage,
        run_costs=[float(cost) for cost, _, _ in runs if cost is not None],
        runs=len(runs),
        replays=sum(r for _, r, _ in runs),
        replays_passed=sum(p for _, _, p in runs),
    )
