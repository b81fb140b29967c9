"""What the views say of a set of runs, for people: the demo's tables, a quick look."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

_STATUSES = text(
    "SELECT status, count(*), sum(event_count) FROM blackbox_views.runs "
    "WHERE run_id = ANY(:ids) GROUP BY status ORDER BY status"
)
_TYPES = text(
    "SELECT event_type, count(*) FROM blackbox_views.events "
    "WHERE run_id = ANY(:ids) GROUP BY event_type ORDER BY count(*) DESC, event_type"
)
_PARTITIONS = text(
    'SELECT "partition", count(DISTINCT run_id), count(*) FROM blackbox_views.events '
    'WHERE run_id = ANY(:ids) GROUP BY "partition" ORDER BY "partition"'
)
_FIRST_RUNS = text(
    "SELECT run_id, status, event_count, last_sequence, code_version, started_at, finished_at "
    "FROM blackbox_views.runs WHERE run_id = ANY(:ids) ORDER BY started_at LIMIT :limit"
)
_VIOLATIONS = text("SELECT count(*) FROM blackbox_views.integrity_violations")
_INDEXED = text("SELECT count(*) FROM blackbox_views.events WHERE run_id = ANY(:ids)")


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run as the runs view holds it."""

    run_id: str
    status: str
    event_count: int
    last_sequence: int
    code_version: str | None
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class ViewsSummary:
    """Runs by status (runs, events), events by type, runs and events by partition, the
    first runs, and the integrity violations the views hold (all runs)."""

    statuses: list[tuple[str, int, int]]
    event_types: list[tuple[str, int]]
    partitions: list[tuple[int, int, int]]
    first_runs: list[RunRow]
    violations: int


def views_summary_txn(conn: Connection, run_ids: Sequence[str], *, first: int = 5) -> ViewsSummary:
    """The summary of ``run_ids`` as the views hold them now."""
    ids = {"ids": list(run_ids)}
    return ViewsSummary(
        statuses=[(str(s), int(c), int(e or 0)) for s, c, e in conn.execute(_STATUSES, ids)],
        event_types=[(str(t), int(c)) for t, c in conn.execute(_TYPES, ids)],
        partitions=[(int(p), int(r), int(c)) for p, r, c in conn.execute(_PARTITIONS, ids)],
        first_runs=[RunRow(*row) for row in conn.execute(_FIRST_RUNS, {**ids, "limit": first})],
        violations=int(conn.execute(_VIOLATIONS).scalar_one()),
    )


def indexed_events_txn(conn: Connection, run_ids: Sequence[str]) -> int:
    """How many events of ``run_ids`` the events index holds."""
    return int(conn.execute(_INDEXED, {"ids": list(run_ids)}).scalar_one())
