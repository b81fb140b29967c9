"""The key store's rows as a backup copies them and a restore writes them back: data
keys and tenant keys, always wrapped (a backup never holds a key-encryption key, so it
opens nothing without the KEK kept elsewhere). Caller's connection, never a commit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, text

_BATCH = 2_000

DATA_KEY_COLUMNS = (
    "key_id",
    "run_id",
    "tenant_id",
    "kek_version",
    "wrapped",
    "created_at",
    "destroyed_at",
    "destroyed_reason",
)
TENANT_KEY_COLUMNS = ("tenant_id", "kek_version", "wrapped", "created_at")

_DATA_KEYS = text(
    f"SELECT {', '.join(DATA_KEY_COLUMNS)} FROM blackbox.data_keys ORDER BY key_id"
).execution_options(yield_per=_BATCH)
_TENANT_KEYS = text(
    f"SELECT {', '.join(TENANT_KEY_COLUMNS)} FROM blackbox.tenant_keys ORDER BY tenant_id"
).execution_options(yield_per=_BATCH)
_RESTORE_DATA_KEYS = text(
    f"INSERT INTO blackbox.data_keys ({', '.join(DATA_KEY_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in DATA_KEY_COLUMNS)}) ON CONFLICT (key_id) DO NOTHING"
)
_RESTORE_TENANT_KEYS = text(
    f"INSERT INTO blackbox.tenant_keys ({', '.join(TENANT_KEY_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in TENANT_KEY_COLUMNS)}) "
    "ON CONFLICT (tenant_id) DO NOTHING"
)


def data_key_rows_txn(conn: Connection) -> Iterator[dict[str, Any]]:
    """Every data key row, wrapped (destroyed ones with no key at all), by key id."""
    for row in conn.execute(_DATA_KEYS).mappings():
        yield dict(row)


def tenant_key_rows_txn(conn: Connection) -> Iterator[dict[str, Any]]:
    """Every tenant digest key, wrapped, by tenant."""
    for row in conn.execute(_TENANT_KEYS).mappings():
        yield dict(row)


def restore_data_keys_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert a batch of data key rows (as :func:`data_key_rows_txn` gives them)."""
    if rows:
        conn.execute(_RESTORE_DATA_KEYS, list(rows))


def restore_tenant_keys_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert a batch of tenant key rows (as :func:`tenant_key_rows_txn` gives them)."""
    if rows:
        conn.execute(_RESTORE_TENANT_KEYS, list(rows))


_KEY_STATES = text(
    "SELECT key_id, run_id, wrapped IS NOT NULL FROM blackbox.data_keys "
    "WHERE key_id = ANY(:key_ids) OR run_id = ANY(:run_ids)"
)


def key_states_txn(
    conn: Connection, *, key_ids: Sequence[str] = (), run_ids: Sequence[str] = ()
) -> dict[str, tuple[str, bool]]:
    """Key → (its run, whether it is live) for ``key_ids`` and every key of ``run_ids``
    the store holds (a key it does not hold is absent)."""
    params = {"key_ids": list(key_ids), "run_ids": list(run_ids)}
    return {str(k): (str(r), bool(live)) for k, r, live in conn.execute(_KEY_STATES, params)}


_AUDIT = text(
    "INSERT INTO blackbox.access_audit (principal, purpose, run_id, tenant_id, outcome) "
    "VALUES (:principal, :purpose, :run_id, :tenant_id, :outcome)"
)


def record_access_txn(
    conn: Connection,
    *,
    principal: str,
    purpose: str,
    run_id: str | None,
    tenant_id: str | None,
    outcome: str,
) -> None:
    """Write one row of the access audit (a restore of a run for an investigation, say);
    the caller checked ``purpose`` (:func:`purpose_problem`)."""
    conn.execute(
        _AUDIT,
        {
            "principal": principal,
            "purpose": purpose,
            "run_id": run_id,
            "tenant_id": tenant_id,
            "outcome": outcome,
        },
    )
