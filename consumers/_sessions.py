"""A session read whole: the runs that share a session id, in the order they started,
and what they add up to (events, LLM calls, tokens, cost), for the console's session
page and any other front end.

Like every read of the views, it runs as the caller's role: row security keeps it to
the tenants the role is granted, so a session id used by two tenants shows each only
its own runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Connection, text

from agent_blackbox.consumers._browse import _LIST_COLUMNS, LABEL_COLUMNS, ListedRun, labelled

MAX_SESSION_RUNS = 500
"""Runs a session page lists at most (the totals count them all)."""


@dataclass(frozen=True, slots=True)
class SessionTotals:
    """What every run of a session adds up to."""

    runs: int
    events: int
    llm_calls: int
    tool_calls: int
    errors: int
    failed_runs: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: Decimal | None
    """The exact sum of the priced LLM calls (None: none priced)."""
    unpriced_calls: int
    first_started_at: datetime | None
    last_event_at: datetime | None
    users: tuple[str, ...]
    """The user ids the session's runs name (at most 20, in order)."""


@dataclass(frozen=True, slots=True)
class SessionDetail:
    session_id: str
    totals: SessionTotals
    runs: list[ListedRun]
    """The first :data:`MAX_SESSION_RUNS` runs, oldest start first."""
    runs_cut: bool


_TOTALS = text(
    """
    SELECT count(*), coalesce(sum(r.event_count), 0), coalesce(sum(u.llm_calls), 0),
           coalesce(sum(u.tool_calls), 0), coalesce(sum(u.errors), 0),
           count(*) FILTER (WHERE r.status = 'failed'),
           coalesce(sum(u.prompt_tokens), 0), coalesce(sum(u.completion_tokens), 0),
           coalesce(sum(u.total_tokens), 0), sum(u.cost_usd),
           coalesce(sum(u.unpriced_calls), 0), min(r.started_at), max(r.last_event_at),
           (SELECT coalesce(array_agg(v.user_id ORDER BY v.user_id), '{}')
              FROM (SELECT DISTINCT s.user_id FROM blackbox_views.runs s
                     WHERE s.session_id = :session AND s.user_id IS NOT NULL
                     ORDER BY s.user_id LIMIT 20) v)
      FROM blackbox_views.runs r
      LEFT JOIN blackbox_views.run_rollups u ON u.run_id = r.run_id
     WHERE r.session_id = :session
       -- a run the write side never recorded (its start unverified) counts for nothing
       AND NOT EXISTS (SELECT 1 FROM blackbox_views.events x
                        WHERE x.run_id = r.run_id AND x.sequence = 1
                          AND x.unverified IS NOT NULL)
    """
)


def session_txn(
    conn: Connection, session_id: str, *, limit: int = MAX_SESSION_RUNS
) -> SessionDetail | None:
    """The runs of ``session_id`` the caller's role may see, oldest start first, and
    their totals; None when it sees none."""
    row = conn.execute(_TOTALS, {"session": session_id}).one()
    if not row[0]:
        return None
    counts = [int(v) for v in row[:9]]
    totals = SessionTotals(
        runs=counts[0],
        events=counts[1],
        llm_calls=counts[2],
        tool_calls=counts[3],
        errors=counts[4],
        failed_runs=counts[5],
        prompt_tokens=counts[6],
        completion_tokens=counts[7],
        total_tokens=counts[8],
        cost_usd=row[9],
        unpriced_calls=int(row[10]),
        first_started_at=row[11],
        last_event_at=row[12],
        users=tuple(row[13]),
    )
    listed = conn.execute(
        text(
            f"""
            SELECT {_LIST_COLUMNS}, {LABEL_COLUMNS}
              FROM blackbox_views.runs r
              LEFT JOIN blackbox_views.run_rollups u ON u.run_id = r.run_id
             WHERE r.session_id = :session
             ORDER BY r.started_at NULLS LAST, r.run_id
             LIMIT :limit
            """
        ),
        {"session": session_id, "limit": limit + 1},
    )
    runs = [labelled(r) for r in listed]
    return SessionDetail(session_id, totals, runs[:limit], len(runs) > limit)
