"""Reading the views for a person: the run list with filters, one run whole, one event's
metadata, and usage over time. What the run console shows; plain functions over a
connection, so any other front end can show the same.

Every query runs as the caller's role: the views' row security scopes it to the
tenants that role is granted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, TextClause, text

from agent_blackbox.consumers._search import bitmap_terms, search_clauses, walk_or_bitmaps

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_RUN_EVENTS = 20_000
"""Events a run page lists at most (a longer run is cut, and says so)."""


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the run list is narrowed to; None (or False) leaves a field out."""

    since: datetime | None = None
    until: datetime | None = None
    agent: str | None = None
    status: str | None = None
    model: str | None = None
    code_version: str | None = None
    tenant: str | None = None
    prompt_version: str | None = None
    has_error: bool = False
    latency_above_ms: float | None = None
    session: str | None = None
    user: str | None = None
    run_prefix: str | None = None
    """Runs whose id starts with this."""
    tags: tuple[tuple[str, str | None], ...] = ()
    """Runs with each of these tags (``(name, value)``; a None value: any value)."""
    tool: str | None = None
    """Runs that called this tool."""
    error_class: str | None = None
    """Runs that failed with, or had a call fail with, this error class."""
    text: str | None = None
    """Runs whose LLM messages hold these words (full-text, tenants that opted in)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: after this run in the list's order (newest first)."""

    started_at: datetime
    run_id: str


@dataclass(frozen=True, slots=True)
class ListedRun:
    run_id: str
    tenant_id: str
    agent_id: str
    status: str
    started_at: datetime | None
    finished_at: datetime | None
    event_count: int
    code_version: str | None
    parent_run_id: str | None
    prompt_version: str | None
    llm_calls: int
    errors: int
    total_tokens: int
    max_latency_ms: float | None
    models: tuple[str, ...]
    unrecorded_calls: int | None = None
    """Calls the run's code made through no boundary (None: none, or not finished)."""
    unrecorded_call: str | None = None
    """The first of them: host, port and the agent's line."""
    cost_usd: Decimal | None = None
    """The exact sum of its priced LLM calls (None: none priced)."""
    unpriced_calls: int = 0
    """Its LLM calls that did not fail and have no known cost."""
    llm_errors: int = 0
    """LLM calls that failed (``errors`` counts every failed call, tools' too)."""
    tool_errors: int = 0
    """Tool calls that raised (the agent may have caught the error and carried on)."""
    session_id: str | None = None
    user_id: str | None = None
    unverified: str | None = None
    """Why the write side does not vouch for its first unverified event (None: it
    vouches for every event the views hold of it)."""
    unverified_events: int = 0
    """How many of its events are unverified (counted up to :data:`MARKS_COUNTED`)."""

    @property
    def unverified_title(self) -> str:
        """What the console's ``unverified`` tag says when pointed at."""
        if self.unverified is None:
            return ""
        many = "" if self.unverified_events == 1 else "s"
        more = "+" if self.unverified_events >= MARKS_COUNTED else ""
        return (
            f"{self.unverified_events}{more} event{many} of this run the write side does not "
            f"vouch for (produced to the topic by someone other than the relay?), left out of "
            f"totals and exports; the first: {self.unverified}"
        )


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[ListedRun]
    next: Cursor | None


MARKS_COUNTED = 1000
"""A run's unverified events are counted up to this many (a forged run may hold many)."""

# A listed run's marks: its first unverified event's reason and how many it has, both
# read through the partial index of marked events (nothing read for a clean run).
_LIST_COLUMNS = f"""
    r.run_id, r.tenant_id, r.agent_id, r.status, r.started_at, r.finished_at,
    r.event_count, r.code_version, r.parent_run_id, u.prompt_version,
    coalesce(u.llm_calls, 0), coalesce(u.errors, 0), coalesce(u.total_tokens, 0),
    u.max_latency_ms, coalesce(u.models, '{{}}'), r.unrecorded_calls, r.unrecorded_call,
    u.cost_usd, coalesce(u.unpriced_calls, 0),
    (SELECT x.unverified FROM blackbox_views.events x
      WHERE x.run_id = r.run_id AND x.unverified IS NOT NULL ORDER BY x.sequence LIMIT 1),
    (SELECT count(*) FROM (SELECT 1 FROM blackbox_views.events x
      WHERE x.run_id = r.run_id AND x.unverified IS NOT NULL LIMIT {MARKS_COUNTED}) m)
"""


def list_runs_txn(
    conn: Connection, where: RunFilter, *, after: Cursor | None = None, limit: int = PAGE_SIZE
) -> RunPage:
    """One page of runs, newest start first, narrowed by ``where``, after ``after``.

    Keyset paging on (start time, run id): each page costs the same however deep it is.
    Runs not started yet (no ``run.started`` seen) are not listed.
    """
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    # A filter only the rollups hold (model, prompt version, latency) drives the page
    # from the rollups, which repeat the runs' identity and start: each candidate is
    # then checked in the row already read, not by a lookup of another table per run.
    by_rollup = bool(
        where.model
        or where.prompt_version
        or where.latency_above_ms is not None
        or bitmap_terms(where)
    )
    d = "u" if by_rollup else "r"
    clauses = [f"{d}.started_at IS NOT NULL"]
    params: dict[str, Any] = {"limit": limit + 1}
    simple = {
        "agent": f"{d}.agent_id",
        "status": "r.status",
        "code_version": f"{d}.code_version",
        "tenant": f"{d}.tenant_id",
        "prompt_version": "u.prompt_version",
    }
    for name, column in simple.items():
        value = getattr(where, name)
        if value:
            clauses.append(f"{column} = :{name}")
            params[name] = value
    if where.since is not None:
        clauses.append(f"{d}.started_at >= :since")
        params["since"] = where.since
    if where.until is not None:
        clauses.append(f"{d}.started_at < :until")
        params["until"] = where.until
    if where.model:
        clauses.append("u.models @> ARRAY[CAST(:model AS text)]")
        params["model"] = where.model
    if where.has_error:
        clauses.append("(u.errors > 0 OR r.status = 'failed')")
    if where.latency_above_ms is not None:
        clauses.append("u.max_latency_ms > :latency")
        params["latency"] = where.latency_above_ms
    clauses += search_clauses(where, params, "r", "u")
    if after is not None:
        clauses.append(f"({d}.started_at, {d}.run_id) < (:after_at, :after_id)")
        params.update(after_at=after.started_at, after_id=after.run_id)
    tables = (
        "blackbox_views.run_rollups u JOIN blackbox_views.runs r ON r.run_id = u.run_id"
        if by_rollup
        else "blackbox_views.runs r LEFT JOIN blackbox_views.run_rollups u ON u.run_id = r.run_id"
    )

    def statement(bitmaps: bool) -> TextClause:
        return text(
            f"""
            SELECT {_LIST_COLUMNS}, {LABEL_COLUMNS}
              FROM {tables}
             WHERE {" AND ".join(clauses)}
             ORDER BY {_newest(d, bitmaps=bitmaps)}
             LIMIT :limit
            """
        )

    if bitmap_terms(where):
        found = walk_or_bitmaps(conn, statement(False), statement(True), params)
    else:
        found = conn.execute(statement(False), params).all()
    rows = [labelled(row) for row in found]
    more = len(rows) > limit
    rows = _with_failures(conn, rows[:limit])
    last = rows[-1] if more else None
    cursor = (
        None if last is None or last.started_at is None else Cursor(last.started_at, last.run_id)
    )
    return RunPage(rows, cursor)


_FAILURES = text(
    """
    SELECT run_id, 'llm', count(*) FROM blackbox_views.llm_calls
     WHERE run_id = ANY(:run_ids) AND error_class IS NOT NULL AND unverified IS NULL
     GROUP BY run_id
    UNION ALL
    SELECT run_id, 'tool', count(*) FROM blackbox_views.tool_calls
     WHERE run_id = ANY(:run_ids) AND error_class IS NOT NULL AND unverified IS NULL
     GROUP BY run_id
    """
)


def _with_failures(conn: Connection, runs: list[ListedRun]) -> list[ListedRun]:
    """``runs`` with their failed calls told apart by what failed: the rollups sum
    every failed call, and a tool error the agent caught is not a failed LLM call. Only
    runs with a failure are looked up (by the call views' primary keys)."""
    failing = [r.run_id for r in runs if r.errors]
    if not failing:
        return runs
    counts: dict[tuple[str, str], int] = {
        (run_id, kind): int(count)
        for run_id, kind, count in conn.execute(_FAILURES, {"run_ids": failing})
    }
    llm = {run_id: n for (run_id, kind), n in counts.items() if kind == "llm"}
    tool = {run_id: n for (run_id, kind), n in counts.items() if kind == "tool"}
    return [
        replace(r, llm_errors=llm.get(r.run_id, 0), tool_errors=tool.get(r.run_id, 0)) for r in runs
    ]


LABEL_COLUMNS = "r.session_id, r.user_id"
"""Selected after the list's columns: a listed run's session and user."""


def labelled(row: Any) -> ListedRun:
    """A listed run from a row of the list's columns and then :data:`LABEL_COLUMNS`."""
    return replace(_listed(row), session_id=row[-2], user_id=row[-1])


def _newest(alias: str, *, bitmaps: bool) -> str:
    """The list's order. With ``bitmaps``, the start is read through an expression no
    index gives: the planner then reads (and intersects) the terms' bitmaps and sorts
    what passed, instead of walking the runs newest first (see
    :func:`walk_or_bitmaps`)."""
    started = f"({alias}.started_at + interval '0 s')" if bitmaps else f"{alias}.started_at"
    return f"{started} DESC NULLS LAST, {alias}.run_id DESC"


def _listed(row: Any) -> ListedRun:
    return ListedRun(
        run_id=row[0],
        tenant_id=row[1],
        agent_id=row[2],
        status=row[3],
        started_at=row[4],
        finished_at=row[5],
        event_count=int(row[6]),
        code_version=row[7],
        parent_run_id=row[8],
        prompt_version=row[9],
        llm_calls=int(row[10]),
        errors=int(row[11]),
        total_tokens=int(row[12]),
        max_latency_ms=row[13],
        models=tuple(row[14]),
        unrecorded_calls=row[15],
        unrecorded_call=row[16],
        cost_usd=row[17],
        unpriced_calls=int(row[18]),
        unverified=row[19],
        unverified_events=int(row[20]),
    )


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run as the index and the analytics views know it (never a body)."""

    sequence: int
    event_id: str
    event_type: str
    recorded_at: datetime
    attributes: dict[str, str]
    latency_ms: float | None
    sealed: bool
    out_of_line: bool
    cost_usd: Decimal | None = None
    """An LLM call's exact cost (None: unknown, or not an LLM call)."""
    unverified: str | None = None
    """Why the write side does not vouch for it (None: it does)."""

    @property
    def branch(self) -> int:
        """The branch of concurrent work it ran in (0: the run's own)."""
        raw = self.attributes.get("branch", "0")
        return int(raw) if raw.isdigit() else 0


@dataclass(frozen=True, slots=True)
class EffectPair:
    effect: str | None
    intent_sequence: int | None
    intent_at: datetime | None
    receipt_sequence: int | None
    receipt_at: datetime | None
    status: str | None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    id: int
    code_version: str | None
    result: str
    passed: bool
    divergence_kind: str | None
    divergence_sequence: int | None
    duration_ms: float | None
    at: datetime | None
    detail: str | None = None
    """The first divergence in words (never a value)."""
    values_kept: bool = False
    """Whether the values behind it were kept, to open for a purpose."""


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run whole, from the views: the console's run page."""

    run: ListedRun
    finished_at: datetime | None
    tags: dict[str, str]
    replayability: str | None
    events: list[RunEvent]
    events_cut: bool
    effects: list[EffectPair]
    replays: list[ReplayResult]
    forks: list[str] = field(default_factory=list)
    prompt_templates: str | None = None
    """``id@digest`` of each prompt template of the run's snapshot."""
    experiment: tuple[str, str, str] | None = None
    """For a fork an experiment made: (experiment id, its name, the run it forked)."""


def run_detail_txn(conn: Connection, run_id: str) -> RunDetail | None:
    """Everything the views hold of ``run_id``; None when they do not hold it (or the
    caller's role may not see its tenant)."""
    row = conn.execute(
        text(
            f"SELECT {_LIST_COLUMNS}, coalesce(u.tags, '{{}}'::jsonb), p.replayability, "
            f"u.prompt_templates, {LABEL_COLUMNS} "
            "FROM blackbox_views.runs r "
            "LEFT JOIN blackbox_views.run_rollups u ON u.run_id = r.run_id "
            "LEFT JOIN blackbox_views.run_replayability p ON p.run_id = r.run_id "
            "WHERE r.run_id = :run_id"
        ),
        {"run_id": run_id},
    ).first()
    if row is None:
        return None
    run = _with_failures(conn, [labelled(row)])[0]
    events = run_events_txn(conn, run_id, limit=MAX_RUN_EVENTS + 1)
    effects = [
        EffectPair(*r)
        for r in conn.execute(
            text(
                "SELECT effect, intent_sequence, intent_at, receipt_sequence, receipt_at, status "
                "FROM blackbox_views.effects WHERE run_id = :run_id "
                "ORDER BY coalesce(intent_sequence, receipt_sequence)"
            ),
            {"run_id": run_id},
        )
    ]
    replays = [
        ReplayResult(int(r[0]), r[1], r[2], bool(r[3]), r[4], r[5], r[6], r[7], r[8], r[9])
        for r in conn.execute(
            text(
                "SELECT id, code_version, result, passed, divergence_kind, divergence_sequence, "
                "duration_ms, replayed_at, divergence_detail, values_kept "
                "FROM blackbox_views.replay_results "
                "WHERE run_id = :run_id ORDER BY id DESC LIMIT 20"
            ),
            {"run_id": run_id},
        )
    ]
    forks = list(
        conn.execute(
            text(
                "SELECT run_id FROM blackbox_views.runs WHERE parent_run_id = :run_id "
                "ORDER BY started_at LIMIT 100"
            ),
            {"run_id": run_id},
        ).scalars()
    )
    return RunDetail(
        run=run,
        finished_at=run.finished_at,
        tags=dict(row[21]),
        replayability=row[22],
        events=events[:MAX_RUN_EVENTS],
        events_cut=len(events) > MAX_RUN_EVENTS,
        effects=effects,
        replays=replays,
        forks=forks,
        prompt_templates=row[23],
    )


def run_events_txn(
    conn: Connection, run_id: str, *, first: int = 1, limit: int = MAX_RUN_EVENTS
) -> list[RunEvent]:
    """``run_id``'s indexed events from sequence ``first``, in sequence order, each
    with its call latency when it is an LLM or tool call."""
    rows = conn.execute(
        text(
            """
            SELECT e.sequence, e.event_id, e.event_type, e.recorded_at,
                   coalesce(e.attributes, '{}'::jsonb), coalesce(l.latency_ms, t.latency_ms),
                   e.key_id IS NOT NULL, e.payload_ref IS NOT NULL, l.cost_usd,
                   e.unverified
              FROM blackbox_views.events e
              LEFT JOIN blackbox_views.llm_calls l
                     ON l.run_id = e.run_id AND l.sequence = e.sequence
              LEFT JOIN blackbox_views.tool_calls t
                     ON t.run_id = e.run_id AND t.sequence = e.sequence
             WHERE e.run_id = :run_id AND e.sequence >= :first
             ORDER BY e.sequence
             LIMIT :limit
            """
        ),
        {"run_id": run_id, "first": first, "limit": limit},
    )
    return [
        RunEvent(
            sequence=int(r[0]),
            event_id=r[1],
            event_type=r[2],
            recorded_at=r[3],
            attributes={str(k): str(v) for k, v in dict(r[4]).items()},
            latency_ms=r[5],
            sealed=bool(r[6]),
            out_of_line=bool(r[7]),
            cost_usd=r[8],
            unverified=r[9],
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class UsagePoint:
    """One time bucket of one group's LLM calls."""

    bucket: datetime
    group: str | None
    calls: int
    errors: int
    total_tokens: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    cost_usd: Decimal | None = None
    """The exact sum of the bucket's priced calls (None: none priced)."""


USAGE_GROUPS = {"model": "c.model", "prompt_version": "c.prompt_version", "agent": "c.agent_id"}
"""What usage over time may be split by, and the column each splits on."""


def usage_series_txn(
    conn: Connection, *, since: datetime, bucket: str, by: str
) -> list[UsagePoint]:
    """LLM calls since ``since`` per ``bucket`` (``minute`` or ``hour``) and group ``by``
    (a key of :data:`USAGE_GROUPS`), oldest bucket first. Percentiles are exact.

    Raises:
        ValueError: an unknown bucket or grouping.
    """
    if bucket not in ("minute", "hour"):
        raise ValueError(f"bucket must be minute or hour, not {bucket!r}")
    column = USAGE_GROUPS.get(by)
    if column is None:
        raise ValueError(f"cannot split by {by!r}; choose one of {', '.join(USAGE_GROUPS)}")
    rows = conn.execute(
        text(
            f"""
            SELECT date_trunc(:bucket, c.recorded_at), {column}, count(*),
                   count(c.error_class), coalesce(sum(c.total_tokens), 0),
                   percentile_cont(0.50) WITHIN GROUP (ORDER BY c.latency_ms),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY c.latency_ms),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY c.latency_ms),
                   sum(c.cost_usd)
              FROM blackbox_views.llm_calls c
             WHERE c.recorded_at >= :since AND c.unverified IS NULL
             GROUP BY 1, 2
             ORDER BY 1, 2
            """
        ),
        {"bucket": bucket, "since": since},
    )
    return [
        UsagePoint(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), r[5], r[6], r[7], r[8])
        for r in rows
    ]
