"""The first projection: the runs view and the events index.

Only envelope fields and ``Envelope.attributes`` are read; payloads are never decoded
(they may be sealed, and the view reader holds no keys). The work per batch is a
constant number of statements whatever its size: one bulk insert of events, one
lookup of the rare conflicting rows, one lookup of whether runs with plaintext bodies
are sealed, one insert of violations, one upsert of runs.

A plaintext body in a run that has a data key was not written by the run's recorder
(see :mod:`agent_blackbox.schemas`' ``SealedRunGuard``): the event stays in the events
index, which says where every event of the topic lives, but it is recorded as an
integrity violation and left out of the runs view, so a forged ``run.finished`` does
not end a run. So is a ``run.redacted`` the write side does not confirm (see
:class:`~agent_blackbox.consumers._redacted_views.RedactionCheck`): it shreds nothing.

The relay puts every event of a run on the partition its key maps to. An event found
on another partition was produced by someone else: it is recorded as a violation and
not indexed at all, so the run index keeps one partition per run and readers never
see it.

An event the write side does not vouch for (see :mod:`~agent_blackbox.consumers._vouching`:
an unknown run, past the run's head, after its ``run.finished``, a chain break) is
indexed with the reason in ``events.unverified`` and changes no run of the write side's
in the runs view; a run the write side never recorded is listed from its own events,
every one of them marked, so that readers can show it as unverified.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    Executable,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    case,
    func,
    select,
    text,
    union,
)
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement, Select, column

from agent_blackbox.broker import run_partition
from agent_blackbox.consumers._batch import BatchOutcome, Delivered, delivered_key
from agent_blackbox.consumers._errors import ProjectionFailed
from agent_blackbox.consumers._redacted_views import (
    SHREDDED_DIGEST,
    RedactionCheck,
    forget_run_labels_txn,
    scrub_redacted_runs_txn,
)
from agent_blackbox.consumers._tables import (
    VIEWS_SCHEMA,
    events_index,
    integrity_violations,
    runs_view,
)
from agent_blackbox.consumers._vouching import Unverified, Vouching
from agent_blackbox.schemas import (
    PLAINTEXT_IN_SEALED_RUN,
    Envelope,
    EventType,
    SealedRunGuard,
    is_plaintext,
)

log = logging.getLogger(__name__)

RUNNING = "running"
FINISHED_WITHOUT_STATUS = "finished"
DIGEST_MISMATCH = "digest_mismatch"
CONFLICTING_DUPLICATE = "conflicting_duplicate"
"""An event at a stored one's place with its digests and chain hash, under another event
id: passed off as a repeat (the signer's ``SignerFinding.CONFLICTING_DUPLICATE`` too)."""
EVENT_ID_REUSED = "event_id_reused"
WRONG_PARTITION = "wrong_partition"
"""An event on another partition than the one its run's key maps to."""
UNCONFIRMED_REDACTION = "unconfirmed_redaction"
"""A ``run.redacted`` that neither the deletion ledger nor a signature confirms."""
_MAX_BIGINT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """The identity and digests of an event already in the events index."""

    run_id: str
    sequence: int
    event_id: str
    input_digest: str
    output_digest: str
    chain_hash: str

    def matches(self, envelope: Envelope) -> bool:
        """Whether ``envelope`` is a copy of this event: the same event id, digests and
        chain hash. A relay's repeat is the same envelope; one under another event id is
        another event at this place (a conflicting duplicate)."""
        return self.event_id == envelope.event_id and self.same_digests(envelope)

    def same_digests(self, envelope: Envelope) -> bool:
        """Whether ``envelope`` carries this event's digests and chain hash (of a shredded
        run, whose digests the views no longer keep, its chain hash: it covers them)."""
        if self.input_digest == SHREDDED_DIGEST:
            return self.chain_hash == envelope.chain_hash
        return (self.input_digest, self.output_digest, self.chain_hash) == (
            envelope.input_digest,
            envelope.output_digest,
            envelope.chain_hash,
        )


@dataclass(frozen=True, slots=True)
class Violation:
    """An incoming event that collides with a stored one but is not the same event, or
    that the views do not trust (``detail`` then says why)."""

    kind: str
    incoming: Delivered
    existing: StoredEvent
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RunDelta:
    """What the newly inserted events of one batch change about one run."""

    run_id: str
    tenant_id: str
    agent_id: str
    event_count: int
    last_sequence: int
    last_event_at: datetime
    started_at: datetime | None = None
    code_version: str | None = None
    parent_run_id: str | None = None
    finished_at: datetime | None = None
    status: str | None = None
    redacted_at: datetime | None = None
    """When the run's keys were destroyed (a ``run.redacted`` in this batch)."""
    unrecorded_calls: int | None = None
    """Calls the run's code made through no boundary, as ``run.finished`` counts them."""
    unrecorded_call: str | None = None
    """The first of them: host, port and the agent's line."""
    session_id: str | None = None
    user_id: str | None = None
    """The run's session and end user, as ``run.started`` names them."""
    finished_sequence: int | None = None
    """The sequence of the run's ``run.finished``."""


def apply_batch(
    conn: Connection,
    records: Sequence[Delivered],
    *,
    partitions: Mapping[str, int] | None = None,
    redactions: RedactionCheck | None = None,
    vouching: Vouching | None = None,
) -> BatchOutcome:
    """Project ``records`` into the views through ``conn``; the caller commits.

    1. Set aside, as violations, events on another partition than their run's key maps
       to (by each topic's partition count in ``partitions``, when given).
    2. Keep the first record of each ``(run_id, sequence)``; later ones are repeats.
    3. Judge the firsts with ``vouching`` and bulk-insert them into the events index,
       each with its mark when unverified, skipping any that collide.
    4. Look up the stored rows of everything that collided (and of the repeats).
    5. Same digests and chain hash: a duplicate, ignored. Different: a violation row.
    6. A new event with a plaintext body in a run that has a data key, or a new
       ``run.redacted`` that ``redactions`` does not confirm: a violation row.
    7. Upsert each run touched by a newly inserted event (but those of step 6 and the
       unverified events of runs the write side knows), once.
    8. A run shredded by a newly inserted, confirmed ``run.redacted``: replace its digests.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused a statement; the caller
            rolls back and retries the batch.
        ProjectionFailed: a collision whose stored row cannot be found.
    """
    misplaced = wrong_partition(records, partitions or {})
    if misplaced:
        set_aside = {id(v.incoming) for v in misplaced}
        records = [r for r in records if id(r) not in set_aside]
    firsts, repeats = split_repeats(records)
    marks = (vouching or Vouching()).unverified(conn, [r.envelope for r in firsts])
    inserted_keys = _insert_events(conn, firsts, marks)
    if len(inserted_keys) == len(firsts):  # the common case: every first is new
        inserted, colliding = firsts, repeats
    else:
        inserted = [r for r in firsts if delivered_key(r) in inserted_keys]
        colliding = [r for r in firsts if delivered_key(r) not in inserted_keys] + repeats
    duplicates, violations = classify_collisions(colliding, _stored_rows(conn, colliding))
    refused = refused_plaintext(inserted, _sealing_rows(conn, inserted))
    notes = _Notes.check(conn, redactions or RedactionCheck(), inserted, violations)
    refused += unconfirmed_redactions(inserted, notes.unconfirmed)
    violations += misplaced + refused
    _record_violations(conn, violations)
    untrusted = {v.incoming.key for v in refused}
    untrusted.update(k for k, why in marks.items() if not why.unknown_run)
    trusted = [r.envelope for r in inserted if not untrusted or delivered_key(r) not in untrusted]
    _upsert_runs(conn, aggregate_runs(trusted))
    _upsert_runs(conn, [replace(d, event_count=0) for d in aggregate_runs(notes.displaced)])
    scrub_redacted_runs_txn(conn, trusted + notes.displaced)
    return BatchOutcome(
        inserted=len(inserted), duplicates=len(duplicates), violations=len(violations)
    )


@dataclass(frozen=True, slots=True)
class _Notes:
    """The ``run.redacted`` of a batch as the write side judged them."""

    unconfirmed: Mapping[str, str]
    """Event id → why the write side does not confirm the note."""
    displaced: list[Envelope]
    """Confirmed notes that collided with another event at their sequence (one forged
    there first): not indexed, but their run was shredded all the same."""

    @classmethod
    def check(
        cls,
        conn: Connection,
        redactions: RedactionCheck,
        inserted: Sequence[Delivered],
        violations: Sequence[Violation],
    ) -> _Notes:
        collided = [v.incoming.envelope for v in violations]
        collided = [e for e in collided if e.event_type == EventType.RUN_REDACTED]
        unconfirmed = redactions.unconfirmed(conn, [r.envelope for r in inserted] + collided)
        return cls(unconfirmed, [e for e in collided if e.event_id not in unconfirmed])


def wrong_partition(records: Sequence[Delivered], partitions: Mapping[str, int]) -> list[Violation]:
    """The violations of ``records`` that are not on the partition their run's key maps
    to, for the topics whose partition count ``partitions`` gives."""
    violations: list[Violation] = []
    homes: dict[tuple[str, str], int] = {}  # a batch holds few runs: hash each once
    for record in records:
        count = partitions.get(record.topic)
        if count is None:
            continue
        where = (record.topic, record.envelope.run_id)
        expected = homes.get(where)
        if expected is None:
            expected = homes[where] = _home(record.envelope.run_id, count)
        if record.partition != expected:
            detail = (
                f"it is on partition {record.partition}, but the run's key maps to "
                f"partition {expected} of {count}: the relay did not produce it"
            )
            violations.append(Violation(WRONG_PARTITION, record, _nothing(record), detail))
    return violations


@lru_cache(maxsize=65_536)
def _home(run_id: str, partitions: int) -> int:
    """:func:`run_partition`, remembered: a run's events arrive over many batches."""
    return run_partition(run_id, partitions)


def unconfirmed_redactions(
    records: Sequence[Delivered], unconfirmed: Mapping[str, str]
) -> list[Violation]:
    """The violations of the ``run.redacted`` among ``records`` whose event id
    ``unconfirmed`` names, with its reason."""
    if not unconfirmed:
        return []
    return [
        Violation(UNCONFIRMED_REDACTION, r, _nothing(r), unconfirmed[r.envelope.event_id])
        for r in records
        if r.envelope.event_id in unconfirmed
    ]


def _nothing(record: Delivered) -> StoredEvent:
    """No stored event: the violation concerns the incoming event alone."""
    envelope = record.envelope
    return StoredEvent(envelope.run_id, envelope.sequence, envelope.event_id, "", "", "")


def views_screen(envelope: Envelope) -> str | None:
    """Why ``envelope`` cannot enter the views, or ``None`` when it can.

    Postgres rejects NUL characters in text and sequences beyond bigint; such a
    message would fail its batch forever, so the runtime dead-letters it instead.
    """
    if not 1 <= envelope.sequence <= _MAX_BIGINT:
        return f"sequence {envelope.sequence} is outside 1..{_MAX_BIGINT}"
    # The common case: one search over every field _texts names (and the attributes
    # it does not name: a handful of short strings, cheaper searched than picked out).
    every = "".join(
        (
            *(envelope.event_id, envelope.run_id, envelope.event_type, envelope.tenant_id),
            *(envelope.agent_id, envelope.input_digest, envelope.output_digest),
            *(envelope.chain_hash, envelope.key_id or "", envelope.payload_ref or ""),
            *envelope.attributes,
            *envelope.attributes.values(),
            *envelope.subject_ids,
        )
    )
    if "\x00" not in every:
        return None
    for name, value in _texts(envelope):
        if value is not None and "\x00" in value:
            return f"envelope field {name} contains a NUL character"
    # The attributes are written whole (a tool's, a model's name: any of them).
    for key, value in envelope.attributes.items():
        if "\x00" in key or "\x00" in value:
            return f"envelope attribute {key!r} contains a NUL character"
    return "an envelope subject id contains a NUL character"


def split_repeats(records: Sequence[Delivered]) -> tuple[list[Delivered], list[Delivered]]:
    """Split into the first record of each ``(run_id, sequence)`` and the later repeats."""
    seen: set[tuple[str, int]] = set()
    firsts: list[Delivered] = []
    repeats: list[Delivered] = []
    for record, key in zip(records, map(delivered_key, records), strict=True):
        if key in seen:
            repeats.append(record)
        else:
            seen.add(key)
            firsts.append(record)
    return firsts, repeats


def classify_collisions(
    colliding: Sequence[Delivered], stored: Iterable[StoredEvent]
) -> tuple[list[Delivered], list[Violation]]:
    """Sort colliding records into duplicates and violations against the stored rows.

    A record collides either on ``(run_id, sequence)`` or, failing that, on its
    ``event_id`` (an id reused by a different event is a violation too).

    Raises:
        ProjectionFailed: a record whose stored counterpart is missing.
    """
    by_key = {(s.run_id, s.sequence): s for s in stored}
    by_event_id = {s.event_id: s for s in by_key.values()}
    duplicates: list[Delivered] = []
    violations: list[Violation] = []
    for record in colliding:
        existing = by_key.get(record.key)
        if existing is not None and existing.matches(record.envelope):
            duplicates.append(record)
        elif existing is not None:
            # The digests of the event at its place under another event id: a copy
            # passed off as this event (as the signer names it), else another event.
            same = existing.same_digests(record.envelope)
            kind = CONFLICTING_DUPLICATE if same else DIGEST_MISMATCH
            violations.append(Violation(kind, record, existing))
        elif (reused := by_event_id.get(record.envelope.event_id)) is not None:
            violations.append(Violation(EVENT_ID_REUSED, record, reused))
        else:
            raise ProjectionFailed(
                f"event {record.key} collided on insert but no stored row matches it; "
                "the batch was rolled back and will be retried"
            )
    return duplicates, violations


def refused_plaintext(
    records: Sequence[Delivered], sealing: Mapping[str, SealedBy]
) -> list[Violation]:
    """The violations of ``records`` that carry a plaintext body in a run that has a data
    key, by the key the run shows in ``sealing`` (stored events) or in ``records``.

    ``existing`` of each violation is the event that showed the run sealed.
    """
    plain = [is_plaintext(r.envelope) for r in records]
    if not any(plain):
        return []  # no plaintext body to refuse
    if not sealing and all(plain):
        return []  # no run shows a data key, neither stored nor in the batch
    grouped: dict[str, list[Delivered]] = {}
    for record in records:
        grouped.setdefault(record.envelope.run_id, []).append(record)
    violations: list[Violation] = []
    for run_id, run_records in grouped.items():
        sealed_by = sealing.get(run_id)
        guard = (
            SealedRunGuard(key_id=sealed_by.key_id, sealed_at=sealed_by.event.sequence)
            if sealed_by is not None
            else SealedRunGuard()
        )
        for record in sorted(run_records, key=lambda r: r.envelope.sequence):
            refusal = guard.refusal(record.envelope)
            if sealed_by is None and guard.key_id is not None:
                sealed_by = SealedBy(_stored(record.envelope), guard.key_id)
            if refusal is not None and sealed_by is not None:
                violations.append(Violation(PLAINTEXT_IN_SEALED_RUN, record, sealed_by.event))
    return violations


@dataclass(frozen=True, slots=True)
class SealedBy:
    """The stored event that shows a run has a data key, and that key's id."""

    event: StoredEvent
    key_id: str


def _stored(envelope: Envelope) -> StoredEvent:
    return StoredEvent(
        envelope.run_id,
        envelope.sequence,
        envelope.event_id,
        envelope.input_digest,
        envelope.output_digest,
        envelope.chain_hash,
    )


def aggregate_runs(envelopes: Iterable[Envelope]) -> list[RunDelta]:
    """One :class:`RunDelta` per run, in ``run_id`` order (a stable lock order)."""
    grouped: dict[str, list[Envelope]] = {}
    for envelope in envelopes:
        grouped.setdefault(envelope.run_id, []).append(envelope)
    return [_run_delta(grouped[run_id]) for run_id in sorted(grouped)]


def _run_delta(envelopes: list[Envelope]) -> RunDelta:
    first = envelopes[0]
    last_sequence = first.sequence
    last_event_at = first.recorded_at
    # The last event of each type that changes the run, by sequence.
    marks: dict[str, Envelope] = {}
    for envelope in envelopes:
        if envelope.sequence > last_sequence:
            last_sequence = envelope.sequence
        if envelope.recorded_at > last_event_at:
            last_event_at = envelope.recorded_at
        if envelope.event_type in _RUN_MARKS:
            seen = marks.get(envelope.event_type)
            if seen is None or envelope.sequence > seen.sequence:
                marks[envelope.event_type] = envelope
    started = marks.get(EventType.RUN_STARTED)
    finished = marks.get(EventType.RUN_FINISHED)
    redacted = marks.get(EventType.RUN_REDACTED)
    return RunDelta(
        run_id=first.run_id,
        tenant_id=first.tenant_id,
        agent_id=first.agent_id,
        event_count=len(envelopes),
        last_sequence=last_sequence,
        last_event_at=last_event_at,
        started_at=started.recorded_at if started else None,
        code_version=started.attributes.get("code_version") if started else None,
        parent_run_id=started.attributes.get("parent_run_id") if started else None,
        finished_at=finished.recorded_at if finished else None,
        finished_sequence=finished.sequence if finished else None,
        status=finished.attributes.get("status", FINISHED_WITHOUT_STATUS) if finished else None,
        redacted_at=redacted.recorded_at if redacted else None,
        unrecorded_calls=_count(finished.attributes.get("unrecorded_calls")) if finished else None,
        unrecorded_call=finished.attributes.get("unrecorded_call") if finished else None,
        session_id=started.attributes.get("session_id") if started else None,
        user_id=started.attributes.get("user_id") if started else None,
    )


def _count(value: str | None) -> int | None:
    """A count an attribute carries, or None when it carries none (or not a count)."""
    return int(value) if value is not None and value.isdigit() else None


_RUN_MARKS = frozenset({EventType.RUN_STARTED, EventType.RUN_FINISHED, EventType.RUN_REDACTED})


def _texts(envelope: Envelope) -> Iterable[tuple[str, str | None]]:
    yield from (
        ("event_id", envelope.event_id),
        ("run_id", envelope.run_id),
        ("event_type", envelope.event_type),
        ("tenant_id", envelope.tenant_id),
        ("agent_id", envelope.agent_id),
        ("input_digest", envelope.input_digest),
        ("output_digest", envelope.output_digest),
        ("chain_hash", envelope.chain_hash),
        ("key_id", envelope.key_id),
        ("payload_ref", envelope.payload_ref),
    )
    for name in ("code_version", "parent_run_id", "status", "session_id", "user_id"):
        yield (f"attributes.{name}", envelope.attributes.get(name))


def _unnest(table: Table, columns: dict[str, list[Any]]) -> Select[Any]:
    """``SELECT * FROM unnest(:a, :b, ...)``: a whole batch as one set of array parameters."""
    arrays = [
        bindparam(f"u_{name}", values, type_=pg.ARRAY(table.c[name].type))
        for name, values in columns.items()
    ]
    rows = (
        func.unnest(*arrays)
        .table_valued(*(column(name, table.c[name].type) for name in columns), name="u")
        .render_derived()
    )
    return select(*(rows.c[name] for name in columns))


def _execute_arrays(
    conn: Connection,
    name: str,
    statement: Callable[[], Executable],
    arrays: dict[str, list[Any]],
) -> Sequence[Any]:
    """Execute the statement ``statement()`` builds with ``arrays`` (its array
    parameters) sent in binary.

    Dumping a long list in the text format quotes every element in Python; the binary
    format packs it in the driver's compiled code, many times faster. The statement is
    built and compiled once per ``name`` (building one costs about a millisecond, every
    batch otherwise) and its array placeholders (each cast to its array type in the
    statement) switched to the binary format. Any other driver is given the statement
    as it is.

    Returns:
        The statement's rows (none when it returns none).
    """
    if conn.dialect.driver != "psycopg":
        return _rows(conn.execute(statement(), arrays))
    sql = _BINARY_SQL.get(name)
    if sql is None:
        sql = str(cast(ClauseElement, statement()).compile(dialect=conn.dialect))
        for param in arrays:
            placeholder = f"%({param})s"
            if placeholder not in sql:
                raise ProjectionFailed(f"statement {name!r} has no array parameter {param!r}")
            sql = sql.replace(placeholder, f"%({param})b")
        _BINARY_SQL[name] = sql
    return _rows(conn.exec_driver_sql(sql, arrays))


def _rows(result: CursorResult[Any]) -> Sequence[Any]:
    return result.all() if result.returns_rows else []


_BINARY_SQL: dict[str, str] = {}
"""Statement name → its SQL with binary array placeholders (compiled once)."""


def _insert_events(
    conn: Connection, records: Sequence[Delivered], marks: Mapping[tuple[str, int], Unverified]
) -> set[tuple[str, int]]:
    if not records:
        return set()
    ordered = sorted(records, key=delivered_key)  # a stable lock order across consumers
    if conn.dialect.driver == "psycopg":
        return _copy_events(conn, ordered, marks)
    columns = _event_columns(ordered, marks)
    statement = (
        pg.insert(events_index)
        .from_select(list(columns), _unnest(events_index, columns))
        .on_conflict_do_nothing()
        .returning(events_index.c.run_id, events_index.c.sequence)
    )
    rows = _execute_arrays(conn, "insert_events", lambda: statement, _arrays(columns))
    return {(run_id, sequence) for run_id, sequence in rows}


_INCOMING = "blackbox_incoming_events"
"""A temporary table per session, emptied at every commit: the batch's events on
their way into the index."""
_EVENT_COLUMNS = (
    *("run_id", "sequence", "event_id", "event_type", "body_version", "topic"),
    *("partition", "offset", "input_digest", "output_digest", "chain_hash"),
    *("recorded_at", "key_id", "payload_ref", "attributes", "unverified"),
)
_EVENT_TYPES = (
    *("text", "int8", "text", "text", "int4", "text", "int4", "int8", "text", "text"),
    *("text", "timestamptz", "text", "text", "jsonb", "text"),
)
_QUOTED = ", ".join(f'"{name}"' for name in _EVENT_COLUMNS)
_CREATE_INCOMING = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_INCOMING} "
    f"(LIKE {VIEWS_SCHEMA}.events) ON COMMIT DELETE ROWS"
)
_COPY_INCOMING = f"COPY {_INCOMING} ({_QUOTED}) FROM STDIN (FORMAT BINARY)"
_INSERT_INCOMING = (
    f"INSERT INTO {VIEWS_SCHEMA}.events ({_QUOTED}) "
    f"SELECT {_QUOTED} FROM {_INCOMING} ORDER BY run_id, sequence "
    "ON CONFLICT DO NOTHING RETURNING run_id, sequence"
)


def _copy_events(
    conn: Connection, ordered: Sequence[Delivered], marks: Mapping[tuple[str, int], Unverified]
) -> set[tuple[str, int]]:
    """:func:`_insert_events` through ``COPY``: binary rows written by the driver's
    compiled code, about a third of the client's time of the array parameters.

    The batch is copied into a temporary table (created once per session, emptied at
    every commit; a rollback takes its rows with it), then inserted from there in key
    order, skipping the rows that collide. The statement the table is created by
    runs every batch: one created in a transaction that rolled back is gone again.
    """
    driver = conn.connection.driver_connection
    assert driver is not None
    with _driver_errors(conn, _COPY_INCOMING), driver.cursor() as cursor:
        cursor.execute(_CREATE_INCOMING)
        with cursor.copy(_COPY_INCOMING) as copy:
            copy.set_types(_EVENT_TYPES)
            write = copy.write_row
            for r in ordered:
                e = r.envelope
                mark = marks.get((e.run_id, e.sequence)) if marks else None
                # fmt: off
                write((
                    e.run_id, e.sequence, e.event_id, e.event_type, e.body_version,
                    r.topic, r.partition, r.offset, e.input_digest, e.output_digest,
                    e.chain_hash, e.recorded_at, e.key_id, e.payload_ref, e.attributes,
                    None if mark is None else mark.reason,
                ))
                # fmt: on
        cursor.execute(_INSERT_INCOMING)
        return {(run_id, sequence) for run_id, sequence in cursor.fetchall()}


@contextmanager
def _driver_errors(conn: Connection, statement: str) -> Iterator[None]:
    """The driver's errors raised past SQLAlchemy, as SQLAlchemy would have raised them
    (a lost connection invalidated), so the runtime translates them as any other."""
    try:
        yield
    except Exception as exc:
        dbapi = conn.dialect.loaded_dbapi
        if not isinstance(exc, dbapi.Error):
            raise
        lost = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
        if lost:
            conn.invalidate(exc)
        raise DBAPIError.instance(
            statement, None, exc, dbapi.Error, connection_invalidated=lost, dialect=conn.dialect
        ) from exc


def _arrays(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``columns`` as the parameters of :func:`_unnest`."""
    return {f"u_{name}": values for name, values in columns.items()}


def _event_columns(
    records: Sequence[Delivered], marks: Mapping[tuple[str, int], Unverified]
) -> dict[str, list[Any]]:
    envelopes = [r.envelope for r in records]
    return {
        "run_id": [e.run_id for e in envelopes],
        "sequence": [e.sequence for e in envelopes],
        "event_id": [e.event_id for e in envelopes],
        "event_type": [e.event_type for e in envelopes],
        "body_version": [e.body_version for e in envelopes],
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "input_digest": [e.input_digest for e in envelopes],
        "output_digest": [e.output_digest for e in envelopes],
        "chain_hash": [e.chain_hash for e in envelopes],
        "recorded_at": [e.recorded_at for e in envelopes],
        "key_id": [e.key_id for e in envelopes],
        "payload_ref": [e.payload_ref for e in envelopes],
        "attributes": [e.attributes for e in envelopes],
        "unverified": [
            None if (m := marks.get((e.run_id, e.sequence))) is None else m.reason
            for e in envelopes
        ],
    }


def _stored_rows(conn: Connection, colliding: Sequence[Delivered]) -> list[StoredEvent]:
    """The stored rows sharing a ``(run_id, sequence)`` or an ``event_id`` with ``colliding``.

    Joined against unnested arrays rather than long IN lists, which keeps a
    re-delivered batch (every record colliding) as fast as a fresh one.
    """
    if not colliding:
        return []
    c = events_index.c
    keys = sorted({r.key for r in colliding})
    wanted = _unnest(
        events_index,
        {"run_id": [run_id for run_id, _ in keys], "sequence": [seq for _, seq in keys]},
    ).subquery("wanted")
    columns = (c.run_id, c.sequence, c.event_id, c.input_digest, c.output_digest, c.chain_hash)
    by_key = select(*columns).join(
        wanted, and_(c.run_id == wanted.c.run_id, c.sequence == wanted.c.sequence)
    )
    event_ids = sorted({r.envelope.event_id for r in colliding})
    by_event_id = select(*columns).where(
        c.event_id == any_(bindparam("event_ids", event_ids, type_=pg.ARRAY(Text)))
    )
    arrays: dict[str, list[Any]] = {
        "u_run_id": [run_id for run_id, _ in keys],
        "u_sequence": [seq for _, seq in keys],
        "event_ids": event_ids,
    }
    rows = _execute_arrays(conn, "stored_rows", lambda: union(by_key, by_event_id), arrays)
    return [StoredEvent(*row) for row in rows]


# For each run: its first event when sealed, and the latest event before the batch's
# first plaintext one when sealed; two primary key probes, whatever the run's length.
_SEALING = text(
    f"""
    SELECT s.run_id, s.sequence, s.event_id, s.input_digest, s.output_digest,
           s.chain_hash, s.key_id
      FROM unnest(CAST(:run_ids AS text[]), CAST(:befores AS bigint[])) AS w(run_id, before)
     CROSS JOIN LATERAL (
           (SELECT * FROM {VIEWS_SCHEMA}.events e
             WHERE e.run_id = w.run_id AND e.sequence = 1)
           UNION ALL
           (SELECT * FROM {VIEWS_SCHEMA}.events e
             WHERE e.run_id = w.run_id AND e.sequence < w.before
             ORDER BY e.sequence DESC LIMIT 1)
           ) s
     WHERE s.key_id IS NOT NULL
    """
)


def _sealing_rows(conn: Connection, records: Sequence[Delivered]) -> dict[str, SealedBy]:
    """For each run of ``records`` with a plaintext body after its first event: the
    stored event that shows it has a data key, when one does."""
    before: dict[str, int] = {}
    for record in records:
        envelope = record.envelope
        if (
            envelope.sequence > 1
            and is_plaintext(envelope)
            and envelope.event_type != EventType.RUN_REDACTED
        ):
            earliest = before.get(envelope.run_id)
            if earliest is None or envelope.sequence < earliest:
                before[envelope.run_id] = envelope.sequence
    if not before:
        return {}
    run_ids = sorted(before)
    arrays: dict[str, list[Any]] = {"run_ids": run_ids, "befores": [before[r] for r in run_ids]}
    rows = _execute_arrays(conn, "sealing_rows", lambda: _SEALING, arrays)
    sealing: dict[str, SealedBy] = {}
    for *stored, key_id in sorted(rows, key=lambda row: (row[0], row[1])):
        sealing.setdefault(stored[0], SealedBy(StoredEvent(*stored), key_id))
    return sealing


def _record_violations(conn: Connection, violations: Sequence[Violation]) -> None:
    if not violations:
        return
    for violation in violations:
        _warn(violation)
    statement = pg.insert(integrity_violations).on_conflict_do_nothing()
    conn.execute(statement, [_violation_row(v) for v in violations])


def _warn(violation: Violation) -> None:
    incoming, existing = violation.incoming, violation.existing
    envelope = incoming.envelope
    tail: str
    details: tuple[Any, ...]
    if violation.detail:
        tail, details = ": %s; the views do not act on it", (violation.detail,)
    elif violation.kind == PLAINTEXT_IN_SEALED_RUN:
        tail = (
            " carries a plaintext body, but the run is sealed since sequence %d (event %s); "
            "the event was appended by someone other than the run's recorder and is left "
            "out of the runs view"
        )
        details = (existing.sequence, existing.event_id)
    else:
        tail = " has input %s output %s chain %s; stored event %s has input %s output %s chain %s"
        details = (
            *(envelope.input_digest, envelope.output_digest, envelope.chain_hash),
            *(existing.event_id, existing.input_digest, existing.output_digest),
            existing.chain_hash,
        )
    log.warning(
        "integrity violation (%s): run %s sequence %d event %s at %s[%d]@%d" + tail,
        *(violation.kind, envelope.run_id, envelope.sequence, envelope.event_id),
        *(incoming.topic, incoming.partition, incoming.offset),
        *details,
    )


def _violation_row(violation: Violation) -> dict[str, Any]:
    incoming, existing = violation.incoming, violation.existing
    envelope = incoming.envelope
    return {
        "kind": violation.kind,
        "run_id": envelope.run_id,
        "sequence": envelope.sequence,
        "event_id": envelope.event_id,
        "existing_input_digest": existing.input_digest,
        "existing_output_digest": existing.output_digest,
        "existing_chain_hash": existing.chain_hash,
        "incoming_input_digest": envelope.input_digest,
        "incoming_output_digest": envelope.output_digest,
        "incoming_chain_hash": envelope.chain_hash,
        "topic": incoming.topic,
        "partition": incoming.partition,
        "offset": incoming.offset,
    }


def _upsert_runs(conn: Connection, deltas: Sequence[RunDelta]) -> None:
    """Insert or fold in each run's delta; every update is commutative across batches."""
    if not deltas:
        return
    columns = _run_columns(deltas)
    _execute_arrays(conn, "upsert_runs", lambda: _upsert_runs_statement(columns), _arrays(columns))


def _upsert_runs_statement(columns: dict[str, list[Any]]) -> Executable:
    statement = pg.insert(runs_view).from_select(list(columns), _unnest(runs_view, columns))
    new, old = statement.excluded, runs_view.c
    return statement.on_conflict_do_update(
        index_elements=[old.run_id],
        set_={
            "status": case((new.finished_at.is_not(None), new.status), else_=old.status),
            "event_count": old.event_count + new.event_count,
            "last_sequence": func.greatest(old.last_sequence, new.last_sequence),
            "last_event_at": func.greatest(old.last_event_at, new.last_event_at),
            "started_at": func.coalesce(old.started_at, new.started_at),
            "code_version": func.coalesce(old.code_version, new.code_version),
            "parent_run_id": func.coalesce(old.parent_run_id, new.parent_run_id),
            "finished_at": func.coalesce(new.finished_at, old.finished_at),
            "finished_sequence": func.least(old.finished_sequence, new.finished_sequence),
            "redacted_at": func.coalesce(old.redacted_at, new.redacted_at),
            "limited_replay": old.limited_replay | new.limited_replay,
            "unrecorded_calls": func.coalesce(new.unrecorded_calls, old.unrecorded_calls),
            "unrecorded_call": func.coalesce(new.unrecorded_call, old.unrecorded_call),
            # Set once from run.started; a shredded run's stay NULL (its redaction
            # follows its start in the log, so no later start sets them again).
            "session_id": case(
                (old.redacted_at.is_(None), func.coalesce(old.session_id, new.session_id))
            ),
            "user_id": case((old.redacted_at.is_(None), func.coalesce(old.user_id, new.user_id))),
            "updated_at": func.now(),
        },
    )


def _run_columns(deltas: Sequence[RunDelta]) -> dict[str, list[Any]]:
    return {
        "run_id": [d.run_id for d in deltas],
        "tenant_id": [d.tenant_id for d in deltas],
        "agent_id": [d.agent_id for d in deltas],
        "status": [d.status or RUNNING for d in deltas],
        "event_count": [d.event_count for d in deltas],
        "last_sequence": [d.last_sequence for d in deltas],
        "last_event_at": [d.last_event_at for d in deltas],
        "started_at": [d.started_at for d in deltas],
        "code_version": [d.code_version for d in deltas],
        "parent_run_id": [d.parent_run_id for d in deltas],
        "finished_at": [d.finished_at for d in deltas],
        "finished_sequence": [d.finished_sequence for d in deltas],
        "redacted_at": [d.redacted_at for d in deltas],
        "limited_replay": [d.redacted_at is not None for d in deltas],
        "unrecorded_calls": [d.unrecorded_calls for d in deltas],
        "unrecorded_call": [d.unrecorded_call for d in deltas],
        "session_id": [d.session_id for d in deltas],
        "user_id": [d.user_id for d in deltas],
    }


def delete_run_views_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """Delete what the views hold of ``run_ids`` (runs whose metadata expired)."""
    forget_run_labels_txn(conn, run_ids)
    conn.execute(events_index.delete().where(events_index.c.run_id.in_(list(run_ids))))
    conn.execute(runs_view.delete().where(runs_view.c.run_id.in_(list(run_ids))))


def runs_naming_bodies_txn(conn: Connection, refs: Sequence[str]) -> list[tuple[str, int, str]]:
    """``(run_id, sequence, ref)`` of each indexed event whose body is stored out of line
    under one of ``refs``: where to look, not proof (the index keeps the first copy of an
    event it was given, which anyone who may produce to the topic can write)."""
    if not refs:
        return []
    named = select(
        events_index.c.run_id, events_index.c.sequence, events_index.c.payload_ref
    ).where(events_index.c.payload_ref.in_(list(refs)))
    return [(str(run_id), int(sequence), str(ref)) for run_id, sequence, ref in conn.execute(named)]


def runs_in_conflict_txn(conn: Connection) -> list[str]:
    """The runs the views hold an integrity violation of (a copy of an event that
    differed from the one indexed, or came on the wrong partition): the copy indexed
    first may be a forged one, hiding what the real event names."""
    listed = select(integrity_violations.c.run_id).distinct()
    return [str(run_id) for run_id in conn.execute(listed).scalars()]
