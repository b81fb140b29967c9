"""The write side's rows as a backup copies them and a restore writes them back.

Each ``*_rows_txn`` streams one table in a fixed order (so an unchanged table copies to
the same bytes); each ``restore_*_txn`` inserts such rows into another database's write
side, keeping any row already there. All take the caller's connection and never commit:
a backup reads every table in one repeatable-read transaction, a restore writes in its
own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, TextClause, text

# The tenant of a blob in a cut taken before blobs had one.
from agent_blackbox.outbox._blobs import UNATTRIBUTED as UNATTRIBUTED

_BATCH = 2_000

RUN_COLUMNS = (
    "run_id",
    "tenant_id",
    "agent_id",
    "subject_ids",
    "status",
    "last_sequence",
    "chain_head",
    "parent_run_id",
    "code_version",
    "state",
    "classification",
    "retention_class",
    "created_at",
    "updated_at",
)
EFFECT_COLUMNS = (
    "run_id",
    "idempotency_key",
    "effect",
    "intent_sequence",
    "status",
    "external_id",
    "created_at",
    "updated_at",
)
LEDGER_COLUMNS = ("id", "at", "action", "run_id", "key_ids", "subject_id", "reason", "principal")

_TABLES = {
    "runs": (RUN_COLUMNS, "run_id"),
    "effects": (EFFECT_COLUMNS, "run_id, idempotency_key"),
    "deletion_ledger": (LEDGER_COLUMNS, "id"),
}


def _select(table: str) -> TextClause:
    columns, order = _TABLES[table]
    statement = text(f"SELECT {', '.join(columns)} FROM blackbox.{table} ORDER BY {order}")
    return statement.execution_options(yield_per=_BATCH)


def _insert(table: str, *, overriding: bool = False) -> TextClause:
    columns, key = _TABLES[table]
    values = ", ".join(f":{c}" for c in columns)
    identity = " OVERRIDING SYSTEM VALUE" if overriding else ""
    return text(
        f"INSERT INTO blackbox.{table} ({', '.join(columns)}){identity} VALUES ({values}) "
        f"ON CONFLICT ({key}) DO NOTHING"
    )


def _rows(conn: Connection, table: str) -> Iterator[dict[str, Any]]:
    for row in conn.execute(_select(table)).mappings():
        yield dict(row)


def run_rows_txn(conn: Connection) -> Iterator[dict[str, Any]]:
    """Every run row (sequence allocator, chain head, ownership, retention class)."""
    return _rows(conn, "runs")


def effect_rows_txn(conn: Connection) -> Iterator[dict[str, Any]]:
    """Every effect row (intents and what became of them)."""
    return _rows(conn, "effects")


def ledger_rows_txn(conn: Connection) -> Iterator[dict[str, Any]]:
    """Every deletion ledger entry, oldest first."""
    return _rows(conn, "deletion_ledger")


_BLOB_DIGESTS = text(
    "SELECT DISTINCT digest FROM blackbox.blobs ORDER BY digest"
).execution_options(yield_per=_BATCH)
_BLOB_OWNERS = text(
    "SELECT digest, tenant_id FROM blackbox.blobs ORDER BY digest, tenant_id"
).execution_options(yield_per=_BATCH)
_BLOBS = text(
    "SELECT DISTINCT ON (digest) digest, data FROM blackbox.blobs WHERE digest = ANY(:digests)"
)
_RESTORE_BLOB = text(
    "INSERT INTO blackbox.blobs (digest, tenant_id, data, size) "
    "VALUES (:digest, :tenant, :data, :size) ON CONFLICT (digest, tenant_id) DO NOTHING"
)
_LEDGER_IDENTITY = text(
    "SELECT setval(pg_get_serial_sequence('blackbox.deletion_ledger', 'id'), "
    "GREATEST((SELECT max(id) FROM blackbox.deletion_ledger), 1))"
)


def blob_digests_txn(conn: Connection) -> Iterator[str]:
    """The content address of every body stored out of line, in order (each once)."""
    for digest in conn.execute(_BLOB_DIGESTS).scalars():
        yield str(digest)


def blob_owners_txn(conn: Connection) -> Iterator[tuple[str, str]]:
    """Every ``(digest, tenant)`` a body is stored for, in order (``''``: a body
    stored before bodies had a tenant, which only the owner reads)."""
    for digest, tenant in conn.execute(_BLOB_OWNERS):
        yield str(digest), str(tenant)


def blobs_txn(conn: Connection, digests: Sequence[str]) -> dict[str, bytes]:
    """The bytes of each of ``digests`` that is stored."""
    rows = conn.execute(_BLOBS, {"digests": list(digests)})
    return {str(digest): bytes(data) for digest, data in rows}


def restore_blob_txn(conn: Connection, digest: str, tenants: Sequence[str], data: bytes) -> None:
    """Store a body out of line under its content address for each of ``tenants`` (kept
    where already there)."""
    rows = [
        {"digest": digest, "tenant": tenant, "data": data, "size": len(data)} for tenant in tenants
    ]
    conn.execute(_RESTORE_BLOB, rows)


_RESTORE_RUNS = _insert("runs")
_RESTORE_EFFECTS = _insert("effects")
_RESTORE_LEDGER = _insert("deletion_ledger", overriding=True)


def restore_runs_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert a batch of run rows (as :func:`run_rows_txn` gives them)."""
    if rows:
        conn.execute(_RESTORE_RUNS, list(rows))


def restore_effects_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert a batch of effect rows (as :func:`effect_rows_txn` gives them)."""
    if rows:
        conn.execute(_RESTORE_EFFECTS, list(rows))


def restore_ledger_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert a batch of ledger entries with their original ids, then move the id
    sequence past them so later entries keep counting up."""
    if rows:
        conn.execute(_RESTORE_LEDGER, list(rows))
    conn.execute(_LEDGER_IDENTITY)
