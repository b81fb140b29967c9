"""The database snapshot of a backup cut: the rows the topic does not carry.

Read in one repeatable-read, read-only transaction, after the cut's event segments were
written, so every data key an event in the cut was sealed under is in it:

- ``runs`` and ``effects`` (sequence allocators, ownership, retention classes, intents);
- ``data_keys`` and ``tenant_keys``, wrapped: the key-encryption keys' *versions* travel,
  never a KEK, so a backup alone opens nothing;
- ``deletion_ledger``, so a restore knows what was destroyed before the cut;
- ``checkpoints``, the signer's signatures, which cannot be rebuilt;
- ``blobs``: the bodies stored out of line, each once under its content address (an
  incremental copy), and the list of them in the cut with the tenants each belongs to.

Each table is an Avro container file under ``snapshots/<table>/<sha256>.avro``, with
bytes that depend only on the rows, so an unchanged table is not uploaded again.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from fastavro import parse_schema, reader, writer
from sqlalchemy import Connection, Engine, text

import agent_blackbox.outbox.snapshot as write_side
from agent_blackbox.backup._errors import BackupCorrupt
from agent_blackbox.backup._manifest import SnapshotEntry, TableEntry
from agent_blackbox.backup._segment import UNREADABLE_AVRO
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.consumers import checkpoint_rows_txn, restore_checkpoints_txn
from agent_blackbox.keystore import (
    data_key_rows_txn,
    restore_data_keys_txn,
    restore_tenant_keys_txn,
    tenant_key_rows_txn,
)

SNAPSHOTS = "snapshots/"
BLOBS = "blobs/"

_TIME = {"type": "long", "logicalType": "timestamp-micros"}
_TEXTS = {"type": "array", "items": "string"}
_MAYBE_TEXT = ["null", "string"]
_MAYBE_TIME = ["null", _TIME]

Rows = Iterator[dict[str, Any]]
Restore = Callable[[Connection, Sequence[dict[str, Any]]], None]


@dataclass(frozen=True, slots=True)
class SnapshotTable:
    """One table a cut copies: its Avro row schema, how to read it and write it back."""

    name: str
    columns: tuple[tuple[str, Any], ...]
    read: Callable[[Connection], Iterable[dict[str, Any]]]
    restore: Restore

    def schema(self) -> Any:
        return parse_schema(
            {
                "type": "record",
                "name": f"{self.name}_row",
                "namespace": "agent_blackbox.backup",
                "fields": [{"name": n, "type": t} for n, t in self.columns],
            }
        )


def _blob_rows(conn: Connection) -> Rows:
    for digest, tenant in write_side.blob_owners_txn(conn):
        yield {"digest": digest, "tenant_id": tenant}


def _no_restore(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    # The blob list is what the cut holds; the bodies are restored from blobs/.
    del conn, rows


TABLES: tuple[SnapshotTable, ...] = (
    SnapshotTable(
        "runs",
        (
            ("run_id", "string"),
            ("tenant_id", "string"),
            ("agent_id", "string"),
            ("subject_ids", _TEXTS),
            ("status", "string"),
            ("last_sequence", "long"),
            ("chain_head", "string"),
            ("parent_run_id", _MAYBE_TEXT),
            ("code_version", _MAYBE_TEXT),
            ("state", _MAYBE_TEXT),
            ("classification", "string"),
            ("retention_class", "string"),
            ("created_at", _TIME),
            ("updated_at", _TIME),
        ),
        write_side.run_rows_txn,
        write_side.restore_runs_txn,
    ),
    SnapshotTable(
        "effects",
        (
            ("run_id", "string"),
            ("idempotency_key", "string"),
            ("effect", "string"),
            ("intent_sequence", "long"),
            ("status", "string"),
            ("external_id", _MAYBE_TEXT),
            ("created_at", _TIME),
            ("updated_at", _TIME),
        ),
        write_side.effect_rows_txn,
        write_side.restore_effects_txn,
    ),
    SnapshotTable(
        "data_keys",
        (
            ("key_id", "string"),
            ("run_id", "string"),
            ("tenant_id", "string"),
            ("kek_version", "string"),
            ("wrapped", ["null", "bytes"]),
            ("created_at", _TIME),
            ("destroyed_at", _MAYBE_TIME),
            ("destroyed_reason", _MAYBE_TEXT),
        ),
        data_key_rows_txn,
        restore_data_keys_txn,
    ),
    SnapshotTable(
        "tenant_keys",
        (
            ("tenant_id", "string"),
            ("kek_version", "string"),
            ("wrapped", "bytes"),
            ("created_at", _TIME),
        ),
        tenant_key_rows_txn,
        restore_tenant_keys_txn,
    ),
    SnapshotTable(
        "deletion_ledger",
        (
            ("id", "long"),
            ("at", _TIME),
            ("action", "string"),
            ("run_id", "string"),
            ("key_ids", _TEXTS),
            ("subject_id", _MAYBE_TEXT),
            ("reason", "string"),
            ("principal", "string"),
        ),
        write_side.ledger_rows_txn,
        write_side.restore_ledger_txn,
    ),
    SnapshotTable(
        "checkpoints",
        (
            ("run_id", "string"),
            ("tenant_id", "string"),
            ("last_sequence", "long"),
            ("chain_head", "string"),
            ("signer_key_id", "string"),
            ("signature", "string"),
            ("signed_at", _TIME),
            ("finished", ["null", "boolean"]),
        ),
        checkpoint_rows_txn,
        restore_checkpoints_txn,
    ),
    # A row per tenant that stored the body (cuts taken before bodies had tenants have
    # none: their bodies are restored for the owner only).
    SnapshotTable(
        "blobs", (("digest", "string"), ("tenant_id", "string")), _blob_rows, _no_restore
    ),
)
TABLES_BY_NAME = {table.name: table for table in TABLES}

_KEK_TABLES = ("data_keys", "tenant_keys")
_BLOB_BATCH = 64


def blob_key(digest: str) -> str:
    """Where the body stored out of line under ``digest`` (``sha256:<hex>``) is kept."""
    return BLOBS + digest.replace(":", "/", 1)


class SnapshotTaker:
    """Takes the snapshots of one backup writer, remembering what the store already
    holds so each table version and each blob is uploaded once.

    Args:
        engine: the production database (the snapshot only reads).
        store: where the backup goes.
    """

    def __init__(self, engine: Engine, store: BackupStore) -> None:
        self._engine = engine
        self._store = store
        self._stored = set(store.keys(SNAPSHOTS)) | set(store.keys(BLOBS))

    def take(self) -> SnapshotEntry:
        """Copy every table in one repeatable-read transaction; upload what changed."""
        tables: dict[str, TableEntry] = {}
        versions: set[str] = set()
        with self._engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.execute(text("SET TRANSACTION READ ONLY"))
                taken_at: datetime = conn.execute(text("SELECT now()")).scalar_one()
                for table in TABLES:
                    rows = table.read(conn)
                    if table.name in _KEK_TABLES:
                        rows = _noting_versions(rows, versions)
                    tables[table.name] = self._upload_table(table, rows)
                blobs = self._upload_blobs(conn)
        return SnapshotEntry(
            taken_at=taken_at.isoformat(),
            tables=tables,
            kek_versions=tuple(sorted(versions)),
            blobs=blobs,
        )

    def _upload_table(self, table: SnapshotTable, rows: Iterable[dict[str, Any]]) -> TableEntry:
        data, count = encode_table(table, rows)
        digest = hashlib.sha256(data).hexdigest()
        key = f"{SNAPSHOTS}{table.name}/{digest}.avro"
        self._put_once(key, data)
        return TableEntry(key=key, sha256=digest, rows=count)

    def _upload_blobs(self, conn: Connection) -> int:
        digests = list(write_side.blob_digests_txn(conn))
        missing = iter([d for d in digests if blob_key(d) not in self._stored])
        while batch := list(islice(missing, _BLOB_BATCH)):
            for digest, data in write_side.blobs_txn(conn, batch).items():
                self._put_once(blob_key(digest), data)
        return len(digests)

    def _put_once(self, key: str, data: bytes) -> None:
        if key not in self._stored:
            self._store.put(key, data)
            self._stored.add(key)


def _noting_versions(rows: Iterable[dict[str, Any]], versions: set[str]) -> Rows:
    for row in rows:
        versions.add(str(row["kek_version"]))
        yield row


def encode_table(table: SnapshotTable, rows: Iterable[dict[str, Any]]) -> tuple[bytes, int]:
    """The table's Avro file (the same bytes for the same rows) and its row count."""
    counted = _Counted(rows)
    out = io.BytesIO()
    writer(
        out,
        table.schema(),
        counted,
        codec="deflate",
        sync_marker=hashlib.sha256(f"snapshot\0{table.name}".encode()).digest()[:16],
        metadata={"agent_blackbox.table": table.name},
    )
    return out.getvalue(), counted.count


def decode_table(table: SnapshotTable, data: bytes, *, key: str) -> Rows:
    """The rows of a table file.

    Raises:
        BackupCorrupt: naming ``key``: the bytes are not that table's file.
    """
    try:
        for record in reader(io.BytesIO(data), reader_schema=table.schema()):
            if not isinstance(record, dict):
                raise BackupCorrupt(f"backup object {key} holds a row that is not a record")
            yield record
    except UNREADABLE_AVRO as exc:
        raise BackupCorrupt(
            f"backup object {key} is not a readable copy of table {table.name}: {exc}"
        ) from exc


class _Counted:
    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows = iter(rows)
        self.count = 0

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> dict[str, Any]:
        row = next(self._rows)
        self.count += 1
        return row
