"""Finding runs and side effects that a crashed agent left open."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from agent_blackbox.outbox._errors import RunNotActive
from agent_blackbox.outbox._writer import Cursor, RunIdentity, shard_of


@dataclass(frozen=True, slots=True)
class PendingEffect:
    """A side effect whose intent committed but whose receipt is missing or unknown.

    ``status`` is ``pending`` when the agent died between intent and receipt, and
    ``unknown`` when the call raised without saying whether it happened.
    """

    run_id: str
    idempotency_key: str
    effect: str
    intent_sequence: int
    status: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a writer needs to carry on recording a run it did not start."""

    identity: RunIdentity
    cursor: Cursor
    status: str
    state: str | None


_UNRESOLVED = text(
    """
    SELECT run_id, idempotency_key, effect, intent_sequence, status, created_at
      FROM blackbox.effects
     WHERE status IN ('pending', 'unknown')
       AND (CAST(:run_id AS text) IS NULL OR run_id = :run_id)
     ORDER BY created_at, run_id, intent_sequence
     LIMIT :limit
    """
)

_RUN = text(
    """
    SELECT tenant_id, agent_id, subject_ids, classification, retention_class,
           last_sequence, chain_head, status, state
      FROM blackbox.runs WHERE run_id = :run_id
    """
)


def unresolved_effects_txn(
    conn: Connection, *, run_id: str | None, limit: int
) -> list[PendingEffect]:
    """Effects still waiting for a receipt, oldest first."""
    rows = conn.execute(_UNRESOLVED, {"run_id": run_id, "limit": limit}).all()
    return [PendingEffect(*row) for row in rows]


def load_run_txn(conn: Connection, run_id: str, *, shards: int) -> StoredRun:
    """The stored identity and cursor of ``run_id``.

    Raises:
        RunNotActive: no such run.
    """
    row = conn.execute(_RUN, {"run_id": run_id}).first()
    if row is None:
        raise RunNotActive(f"run {run_id} does not exist; nothing to resume")
    identity = RunIdentity(
        run_id=run_id,
        tenant_id=row.tenant_id,
        agent_id=row.agent_id,
        shard=shard_of(run_id, shards),
        subject_ids=tuple(row.subject_ids),
        classification=row.classification,
        retention_class=row.retention_class,
    )
    return StoredRun(
        identity, Cursor(int(row.last_sequence), row.chain_head), row.status, row.state
    )
