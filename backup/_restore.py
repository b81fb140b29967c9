"""Restoring a checked cut into a target: the deletion ledger first, then the rows, the
blobs and the events.

The order is the point:

1. the key rows are written with every destruction already applied (the cut's own
   ledger, and ledger entries newer than the cut that the caller found): a destroyed
   key never exists in the target, not even for a moment;
2. the other rows follow in the same transaction, trimmed to the cut: a run's row
   names the last event the cut holds (the snapshot was taken a little after the
   segments), a run with no event in the cut is left out, and a checkpoint signed past
   the cut's events is set aside (counted); before it commits, every run the ledger
   names as shredded gets ``forget``'s scrub (state, subject ids, effects' keys and
   external ids), so a backup taken before a deletion brings none of them back;
3. blobs, each checked against its content address;
4. the events, produced to the target topic on the partition they were read from, with
   their keys, headers and timestamps, envelopes byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from confluent_kafka import KafkaError
from confluent_kafka import Message as KafkaMessage
from sqlalchemy import Connection, Engine

import agent_blackbox.outbox.snapshot as write_side
from agent_blackbox.backup._errors import BackupCorrupt, BackupError
from agent_blackbox.backup._manifest import Manifest, SegmentEntry
from agent_blackbox.backup._segment import decode_segment
from agent_blackbox.backup._snapshot import (
    TABLES,
    TABLES_BY_NAME,
    SnapshotTable,
    decode_table,
)
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._tally import EventTally
from agent_blackbox.backup._verify import fetch_blob, fetch_checked
from agent_blackbox.broker import kafka_errors, new_producer, producer_config
from agent_blackbox.outbox.lifecycle import scrub_shredded_runs_txn
from agent_blackbox.outbox.storage import remember_tenancy_heads_txn
from agent_blackbox.schemas import Settings

_BATCH = 2_000
DESTROYED_AFTER_CUT = "destroyed after the backup cut (ledger entry newer than the cut)"
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Selection:
    """Which runs a restore brings back (None: all of the cut)."""

    run_ids: frozenset[str] | None = None

    def admits(self, run_id: str) -> bool:
        return self.run_ids is None or run_id in self.run_ids


EVERYTHING = Selection()
"""The selection of every run of the cut."""


@dataclass(slots=True)
class RestoredTables:
    """What the table restore wrote and set aside."""

    rows: dict[str, int] = field(default_factory=dict)
    destroyed_after_cut: list[tuple[str, str]] = field(default_factory=list)
    """(run, key) destroyed by a ledger entry newer than the cut, before any write."""
    checkpoints_past_cut: int = 0
    runs_without_events: int = 0
    scrubbed: list[str] = field(default_factory=list)
    """Runs the ledger names as shredded, scrubbed as ``forget`` scrubs them."""


def table_rows(store: BackupStore, cut: Manifest, name: str) -> Iterator[dict[str, Any]]:
    """The rows of table ``name`` in ``cut``'s snapshot, checked against its digest."""
    entry = cut.snapshot.tables.get(name)
    if entry is None:
        raise BackupCorrupt(f"manifest {cut.key}: the snapshot has no table {name!r}")
    return decode_table(
        TABLES_BY_NAME[name], fetch_checked(store, entry.key, entry.sha256), key=entry.key
    )


def restore_tables(
    store: BackupStore,
    cut: Manifest,
    engine: Engine,
    *,
    heads: Mapping[str, tuple[int, str]],
    newer_ledger: Iterable[dict[str, Any]] = (),
    selection: Selection = EVERYTHING,
) -> RestoredTables:
    """Write the cut's rows into the target's write side (see the module), in one
    transaction; ``heads`` is each run's last event in the cut (run → (sequence, chain
    hash)); ``newer_ledger``: ledger rows newer than the cut, applied with it."""
    newer = [dict(r) for r in newer_ledger if selection.admits(str(r["run_id"]))]
    doomed = {(str(r["run_id"]), str(k)) for r in newer for k in r["key_ids"]}
    done = RestoredTables()
    trim = _Trim(heads, selection, doomed, done)
    with engine.begin() as conn:
        for table in TABLES:
            if table.name == "blobs":
                continue
            rows = trim.rows(table.name, table_rows(store, cut, table.name))
            done.rows[table.name] = _write(conn, table, rows)
        # Newer entries after the cut's, and the id sequence moved past all of them.
        write_side.restore_ledger_txn(conn, newer)
        # What forget scrubbed (state, subjects, effect keys and ids) is scrubbed from
        # every run the ledger names, before this transaction makes any row visible.
        done.scrubbed = scrub_shredded_runs_txn(conn)
    return done


def restore_blobs(
    store: BackupStore,
    cut: Manifest,
    engine: Engine,
    *,
    only: frozenset[str] | None = None,
    progress: Progress | None = None,
) -> int:
    """Copy the cut's blobs (those of ``only``, when given) into the target, each
    checked against its content address; how many."""
    owners: dict[str, list[str]] = {}
    before_tenants = False  # a cut from before bodies had tenants: its rows name none
    for row in table_rows(store, cut, "blobs"):
        tenant = row.get("tenant_id")
        before_tenants = before_tenants or tenant is None
        tenant = write_side.UNATTRIBUTED if tenant is None else tenant
        owners.setdefault(str(row["digest"]), []).append(str(tenant))
    if only is not None:
        owners = {d: tenants for d, tenants in owners.items() if d in only}
    with engine.begin() as conn:
        if before_tenants:
            # The runs this cut restored are as they were before bodies had tenants, so
            # their heads are the ones `blackbox migrate` attributes its bodies by. (A
            # later cut's bodies that were still the owner's stay the owner's.)
            remember_tenancy_heads_txn(conn)
        for done, (digest, tenants) in enumerate(owners.items(), 1):
            write_side.restore_blob_txn(conn, digest, tenants, fetch_blob(store, digest))
            if progress is not None:
                progress(done, len(owners))
    return len(owners)


def produce_events(
    store: BackupStore,
    segments: Sequence[SegmentEntry],
    settings: Settings,
    *,
    selection: Selection = EVERYTHING,
    progress: Progress | None = None,
    tally: EventTally | None = None,
) -> dict[int, int]:
    """Produce every message of ``segments`` to ``settings.topic``, on its own
    partition, in offset order; returns the count per partition. Each message is also
    counted into ``tally`` when given (distinct events, re-delivered copies, conflicts).

    Raises:
        BackupCorrupt: a segment is missing or not what its manifest says.
        BackupError: the broker refused a message.
    """
    producer = new_producer(settings, producer_config(settings))
    failures: list[str] = []

    def delivered(error: KafkaError | None, message: KafkaMessage) -> None:
        if error is not None:
            failures.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    counts: dict[int, int] = {}
    with kafka_errors(f"cannot produce to {settings.topic}"):
        for done, segment in enumerate(segments, 1):
            data = fetch_checked(store, segment.key, segment.sha256)
            for message in decode_segment(data, key=segment.key):
                run_id = (message.key or b"").decode("utf-8", "replace")
                if not selection.admits(run_id):
                    continue
                _produce(producer, settings.topic, segment.partition, message, delivered)
                if tally is not None:
                    tally.add(message.value)
                counts[segment.partition] = counts.get(segment.partition, 0) + 1
            if progress is not None:
                progress(done, len(segments))
        left = producer.flush(120)
    if left or failures:
        raise BackupError(
            f"the restored events did not all reach {settings.topic}: "
            f"{left} undelivered, {len(failures)} refused ({'; '.join(failures[:3])})"
        )
    return counts


def _produce(
    producer: Any,
    topic: str,
    partition: int,
    message: Any,
    delivered: Callable[[KafkaError | None, KafkaMessage], None],
) -> None:
    while True:
        try:
            producer.produce(
                topic,
                value=message.value,
                key=message.key,
                partition=partition,
                headers=list(message.headers),
                timestamp=message.timestamp_ms,
                on_delivery=delivered,
            )
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.1)


class _Trim:
    """Per table, the rows of the cut as the target gets them (see the module)."""

    def __init__(
        self,
        heads: Mapping[str, tuple[int, str]],
        selection: Selection,
        doomed: set[tuple[str, str]],
        done: RestoredTables,
    ) -> None:
        self._heads, self._selection, self._doomed, self._done = heads, selection, doomed, done
        self._at = datetime.now(UTC)

    def rows(self, table: str, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        step = getattr(self, f"_{table}", None)
        for row in rows:
            run_id = row.get("run_id")
            if run_id is not None and not self._selection.admits(str(run_id)):
                continue
            kept = row if step is None else step(row)
            if kept is not None:
                yield kept

    def _runs(self, row: dict[str, Any]) -> dict[str, Any] | None:
        head = self._heads.get(row["run_id"])
        if head is None:
            self._done.runs_without_events += 1
            return None
        if row["last_sequence"] > head[0]:
            row["last_sequence"], row["chain_head"] = head
        return row

    def _effects(self, row: dict[str, Any]) -> dict[str, Any] | None:
        return row if row["run_id"] in self._heads else None

    def _data_keys(self, row: dict[str, Any]) -> dict[str, Any]:
        if (row["run_id"], row["key_id"]) in self._doomed and row["wrapped"] is not None:
            row.update(wrapped=None, destroyed_at=self._at, destroyed_reason=DESTROYED_AFTER_CUT)
            self._done.destroyed_after_cut.append((row["run_id"], row["key_id"]))
        return row

    def _checkpoints(self, row: dict[str, Any]) -> dict[str, Any] | None:
        head = self._heads.get(row["run_id"])
        if head is None or row["last_sequence"] > head[0]:
            self._done.checkpoints_past_cut += 1
            return None
        return row


def _write(conn: Connection, table: SnapshotTable, rows: Iterable[dict[str, Any]]) -> int:
    count = 0
    iterator = iter(rows)
    while batch := list(islice(iterator, _BATCH)):
        table.restore(conn, batch)
        count += len(batch)
    return count
