"""What the views say of a set of runs, for people: the demo's tables, a quick look."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


# The columns that say what an event is, not where it lies: a restored copy's events sit
# at other offsets of another topic and must digest the same.
_VIEW_DIGESTS = text(
    """
    SELECT e.run_id, count(*),
           md5(string_agg(concat_ws('|', e.sequence, e.event_id, e.event_type,
                                    e.body_version, e.input_digest, e.output_digest,
                                    e.chain_hash, e.recorded_at, e.key_id, e.payload_ref),
                          ',' ORDER BY e.sequence))
      FROM blackbox_views.events e
      JOIN unnest(CAST(:runs AS text[]), CAST(:lasts AS bigint[])) AS l(run_id, last_sequence)
        ON l.run_id = e.run_id AND e.sequence <= l.last_sequence
     GROUP BY e.run_id
    """
)


def view_digests_txn(conn: Connection, limits: Mapping[str, int]) -> dict[str, tuple[int, str]]:
    """Per run of ``limits`` (run → last sequence), the count and an MD5 of its events'
    index rows up to that sequence (identity, digests, chain hash, time, key, blob; not
    the topic or offset). Two copies of a log digest the same where they hold the same
    events."""
    params = {"runs": list(limits), "lasts": list(limits.values())}
    return {str(r): (int(c), str(d)) for r, c, d in conn.execute(_VIEW_DIGESTS, params)}


_EVENT_SPANS = text(
    "SELECT run_id, count(*), min(sequence), max(sequence) FROM blackbox_views.events "
    "GROUP BY run_id"
)
_KEY_REFERENCES = text(
    "SELECT key_id, min(run_id) FROM blackbox_views.events WHERE key_id IS NOT NULL GROUP BY key_id"
)
_BLOB_REFERENCES = text(
    "SELECT payload_ref, min(run_id) FROM blackbox_views.events WHERE payload_ref IS NOT NULL "
    "GROUP BY payload_ref"
)


def event_spans_txn(conn: Connection) -> dict[str, tuple[int, int, int]]:
    """Per run in the events index: (events, first sequence, last sequence)."""
    return {str(r): (int(c), int(lo), int(hi)) for r, c, lo, hi in conn.execute(_EVENT_SPANS)}


def event_references_txn(conn: Connection) -> tuple[dict[str, str], dict[str, str]]:
    """What the indexed events need besides themselves: data key → a run sealed under
    it, and out-of-line body (``payload_ref``) → a run that stored it."""
    keys = {str(k): str(r) for k, r in conn.execute(_KEY_REFERENCES)}
    blobs = {str(b): str(r) for b, r in conn.execute(_BLOB_REFERENCES)}
    return keys, blobs
