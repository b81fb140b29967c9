"""The signed checkpoints as a backup copies them and a restore writes them back.

The views themselves are not copied: a restore rebuilds them from the restored topic.
The checkpoints are kept, because a signature cannot be rebuilt without the signer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, text

CHECKPOINT_COLUMNS = (
    "run_id",
    "tenant_id",
    "last_sequence",
    "chain_head",
    "signer_key_id",
    "signature",
    "signed_at",
    "finished",
)

_CHECKPOINTS = text(
    f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM blackbox_views.checkpoints ORDER BY run_id"
).execution_options(yield_per=2_000)
_RESTORE = text(
    f"INSERT INTO blackbox_views.checkpoints ({', '.join(CHECKPOINT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in CHECKPOINT_COLUMNS)}) ON CONFLICT (run_id) DO NOTHING"
)


def checkpoint_rows_txn(conn: Connection) -> Iterator[dict[str, Any]]:
    """Every run's latest signed checkpoint, by run."""
    for row in conn.execute(_CHECKPOINTS).mappings():
        yield dict(row)


def restore_checkpoints_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert a batch of checkpoints (as :func:`checkpoint_rows_txn` gives them)."""
    if rows:
        conn.execute(_RESTORE, list(rows))
