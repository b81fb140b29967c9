"""What the write side says a run's head is: the source of truth for the read side's checks.

The checkpoint signer and ``blackbox verify`` compare what the topic holds with this:
a run that is not here was never recorded, and a head the topic has that the database
does not was never committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, text

_HEADS = text(
    "SELECT run_id, tenant_id, status, last_sequence, chain_head FROM blackbox.runs "
    "WHERE run_id IN :run_ids"
).bindparams(bindparam("run_ids", expanding=True))


@dataclass(frozen=True, slots=True)
class RunHead:
    """A run as ``blackbox.runs`` has it: its last committed event and that event's
    chain hash (``last_sequence`` 0 and the genesis hash before the first event)."""

    run_id: str
    tenant_id: str
    status: str
    last_sequence: int
    chain_head: str

    @property
    def running(self) -> bool:
        """Whether the run may still append events (``running``)."""
        return self.status == "running"


def run_heads_txn(conn: Connection, run_ids: Sequence[str]) -> dict[str, RunHead]:
    """The heads of ``run_ids`` that ``blackbox.runs`` holds, by run id; a run the
    database does not know is absent. Reads through the caller's connection, whose role
    must be allowed to see the runs (the reader role can); never commits."""
    if not run_ids:
        return {}
    rows = conn.execute(_HEADS, {"run_ids": sorted(set(run_ids))})
    return {
        str(run_id): RunHead(str(run_id), str(tenant), str(status), int(last), str(head))
        for run_id, tenant, status, last, head in rows
    }
