"""What jobs do to runs after they ended: retention and deletion, through the write side.

``run.redacted`` says the run's data keys were destroyed. It goes through the outbox
like every event, continues the run's hash chain (so the note itself is tamper-evident)
and reaches every consumer of the run's partition after the run's own events.

The retention job of the read side finds the runs that are due, locks them, writes the
deletion ledger and deletes expired metadata only through these functions: the write
side owns the schema ``blackbox``. Every function takes the caller's connection and
never commits. The queries of runs due for shredding read which runs still have live
data keys (the key store's table) in the same statement, so that a page of due runs
shrinks as they are shredded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from agent_blackbox.outbox import _boundaries as b
from agent_blackbox.outbox._core import new_factory, utc_now
from agent_blackbox.outbox._errors import RunNotActive
from agent_blackbox.outbox._postgres import append_txn, load_run_txn
from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.schemas import Envelope, PermissionRefused, Settings, deletion_statement

__all__ = [
    "SHREDDED",
    "RunHead",
    "StatementSigner",
    "append_redaction_txn",
    "delete_run_metadata_txn",
    "lease_epochs",
    "lease_epochs_txn",
    "ledger_key_ids_txn",
    "ledger_readable_txn",
    "lock_run_txn",
    "mark_abandoned_txn",
    "retention_classes_txn",
    "run_head_txn",
    "run_heads_txn",
    "runs_due_for_deletion_txn",
    "runs_due_for_shredding_txn",
    "runs_of_subject_txn",
    "runs_readable_txn",
    "scrub_run_txn",
    "scrub_runs_txn",
    "scrub_shredded_runs_txn",
    "shredded_runs_txn",
    "unscrubbed_runs_txn",
    "write_ledger_txn",
]

SHREDDED = "shredded"
"""What an effect's external id reads as once its run is shredded; its idempotency key
becomes ``shredded:<intent sequence>``, so that the rows stay distinct and countable."""


StatementSigner = Callable[[Mapping[str, Any]], tuple[str, bytes]]
"""Signs a deletion statement: returns the signer's key id and the signature (the
retention job passes its checkpoint signer's ``sign_statement``)."""


def append_redaction_txn(
    conn: Connection,
    run_id: str,
    *,
    reason: str,
    key_ids: list[str],
    subject_id: str | None = None,
    settings: Settings,
    sign: StatementSigner | None = None,
) -> Envelope:
    """Append ``run.redacted`` to ``run_id`` in the caller's transaction; never commits.

    With ``sign``, the note carries a signature over
    :func:`agent_blackbox.schemas.deletion_statement` of this run, tenant and sequence,
    which is what lets a re-application after a restore trust it.

    The caller holds the run row locked (``SELECT ... FOR UPDATE``) so no writer moves
    the run meanwhile.

    Raises:
        RunNotActive: the run does not exist, or it moved on under this transaction.
    """
    stored = load_run_txn(conn, run_id, shards=settings.outbox_shards)
    retention_class = stored.identity.retention_class if reason == "retention" else None
    sequence = stored.cursor.sequence + 1
    signer_key_id, signature = None, None
    if sign is not None:
        statement = deletion_statement(
            run_id=run_id,
            tenant_id=stored.identity.tenant_id,
            sequence=sequence,
            key_ids=key_ids,
            reason=reason,
            subject_id=subject_id,
            retention_class=retention_class,
        )
        signer_key_id, signature = sign(statement)
    crossing = b.run_redacted(
        reason=reason,
        key_ids=key_ids,
        subject_id=subject_id,
        retention_class=retention_class,
        signer_key_id=signer_key_id,
        signature=signature,
    )
    factory = new_factory(settings, None, utc_now)  # plain: no key is left to seal with
    identity = replace(stored.identity, digest=settings.canonicalisation.digest)
    event = factory.prepare(identity, stored.cursor, crossing, event_id=new_event_id())
    if event.envelope.sequence != sequence or not append_txn(conn, identity, event):
        raise RunNotActive(f"run {run_id} moved on while its redaction was appended")
    return event.envelope


@dataclass(frozen=True, slots=True)
class RunHead:
    """What ``blackbox.runs`` says of a run's log: its tenant and the head of its chain."""

    tenant_id: str
    last_sequence: int
    chain_head: str


_LOCK_RUN = text("SELECT status FROM blackbox.runs WHERE run_id = :run_id FOR UPDATE")
_LEDGER = text(
    """
    INSERT INTO blackbox.deletion_ledger (action, run_id, key_ids, subject_id, reason, principal)
    VALUES (:action, :run_id, :key_ids, :subject_id, :reason, session_user)
    """
)
_DUE_FOR_SHREDDING = text(
    """
    SELECT r.run_id FROM blackbox.runs r
     WHERE r.retention_class = :class AND r.status <> 'running' AND r.updated_at < :before
       AND EXISTS (SELECT 1 FROM blackbox.data_keys k
                    WHERE k.run_id = r.run_id AND k.wrapped IS NOT NULL)
     ORDER BY r.updated_at LIMIT :limit
    """
)
_DUE_FOR_DELETION = text(
    """
    SELECT r.run_id FROM blackbox.runs r
     WHERE r.retention_class = :class AND r.status <> 'running' AND r.updated_at < :before
       AND NOT EXISTS (SELECT 1 FROM blackbox.data_keys k
                        WHERE k.run_id = r.run_id AND k.wrapped IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM blackbox.outbox o WHERE o.run_id = r.run_id)
     ORDER BY r.updated_at LIMIT :limit
    """
)
_CLASSES = text("SELECT DISTINCT retention_class FROM blackbox.runs")
# updated_at is left as it was: retention counts from the run's last event.
_ABANDON = text(
    """
    UPDATE blackbox.runs SET status = 'abandoned'
     WHERE run_id IN (SELECT run_id FROM blackbox.runs
                       WHERE status = 'running' AND updated_at < :before
                       ORDER BY updated_at LIMIT :limit
                         FOR UPDATE SKIP LOCKED)
    RETURNING run_id
    """
)
_SUBJECT_RUNS = text(
    "SELECT run_id FROM blackbox.runs WHERE :subject = ANY(subject_ids) ORDER BY created_at"
)
# Only runs whose keys are gone and whose events all left the outbox (run.redacted
# included) lose their metadata; the ledger keeps what was destroyed.
_DELETE_METADATA = [
    text("DELETE FROM blackbox.effects WHERE run_id = ANY(:run_ids)"),
    # A head kept for attributing older bodies dies with its run: a later run given the
    # same id is another run.
    text("DELETE FROM blackbox.blob_tenancy_heads WHERE run_id = ANY(:run_ids)"),
    text("DELETE FROM blackbox.runs WHERE run_id = ANY(:run_ids)"),
]


def lock_run_txn(conn: Connection, run_id: str) -> str | None:
    """Lock the run row of ``run_id`` until the caller's transaction ends (no writer moves
    the run meanwhile); its status, or None when there is no such run."""
    status = conn.execute(_LOCK_RUN, {"run_id": run_id}).scalar()
    return None if status is None else str(status)


def mark_abandoned_txn(conn: Connection, *, before: datetime, limit: int) -> list[str]:
    """Mark ``abandoned`` the runs still ``running`` with no event since ``before`` (their
    writer died and nobody resumed them); their ids. They then fall under retention like
    ended runs, counted from their last event, and can no longer be resumed."""
    params = {"before": before, "limit": limit}
    return [str(r) for r in conn.execute(_ABANDON, params).scalars()]


def write_ledger_txn(
    conn: Connection,
    *,
    action: str,
    run_id: str,
    key_ids: Sequence[str],
    subject_id: str | None,
    reason: str,
) -> None:
    """Write one entry of the deletion ledger, as the session's database user."""
    params = {"action": action, "run_id": run_id, "key_ids": list(key_ids)}
    conn.execute(_LEDGER, {**params, "subject_id": subject_id, "reason": reason})


_SHREDDING_PRIVILEGES = text(
    """
    SELECT privilege FROM (VALUES
        ('UPDATE on blackbox.runs', 'blackbox.runs', 'UPDATE'),
        ('INSERT on blackbox.deletion_ledger', 'blackbox.deletion_ledger', 'INSERT'),
        ('UPDATE on blackbox.data_keys', 'blackbox.data_keys', 'UPDATE')
    ) AS needed (privilege, relation, kind)
     WHERE NOT COALESCE(has_table_privilege(to_regclass(relation), kind), false)
    """
)


def check_may_shred_txn(conn: Connection, *, work: str) -> None:
    """Refuse ``work`` (a deletion) before it looks at anything when the session may not
    destroy keys and write the deletion ledger: with fewer privileges it would see fewer
    runs (its tenants' only, or none) and could report a subject or ledger with nothing
    to do, which it cannot know.

    Raises:
        PermissionRefused: naming what the login lacks.
    """
    missing = [str(p) for p in conn.execute(_SHREDDING_PRIVILEGES).scalars()]
    if missing:
        raise PermissionRefused(
            f"permission denied: {work} needs {', '.join(missing)}, which login "
            f"{conn.exec_driver_sql('SELECT session_user').scalar()!r} lacks; nothing was "
            "looked at or changed"
        )


def retention_classes_txn(conn: Connection) -> list[str]:
    """The retention classes that recorded runs name."""
    return [str(c) for c in conn.execute(_CLASSES).scalars()]


def runs_of_subject_txn(conn: Connection, subject_id: str) -> list[str]:
    """The runs linked to data subject ``subject_id``, oldest first."""
    return [str(r) for r in conn.execute(_SUBJECT_RUNS, {"subject": subject_id}).scalars()]


def runs_due_for_shredding_txn(
    conn: Connection, retention_class: str, *, before: datetime, limit: int
) -> list[str]:
    """Ended runs of ``retention_class``, last moved before ``before``, that still have a
    live data key: their bodies expired."""
    params = {"class": retention_class, "before": before, "limit": limit}
    return [str(r) for r in conn.execute(_DUE_FOR_SHREDDING, params).scalars()]


def runs_due_for_deletion_txn(
    conn: Connection, retention_class: str, *, before: datetime, limit: int
) -> list[str]:
    """Ended runs of ``retention_class``, last moved before ``before``, with no live key
    and nothing left in the outbox: their metadata expired."""
    params = {"class": retention_class, "before": before, "limit": limit}
    return [str(r) for r in conn.execute(_DUE_FOR_DELETION, params).scalars()]


def delete_run_metadata_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """Delete the run rows and effects of ``run_ids`` (their keys are the key store's)."""
    for statement in _DELETE_METADATA:
        conn.execute(statement, {"run_ids": list(run_ids)})


# The effect rows stay (counted, with their effect name, status and sequence): only the
# values an agent chose, which may name a customer, are replaced.
_SCRUB = [
    # The deletion ledger keeps which subject a destruction was for; the run row, which
    # the reader role reads, no longer names the subject once its bodies are gone.
    text(
        """
        UPDATE blackbox.runs SET state = NULL, subject_ids = '{}'
         WHERE run_id = ANY(:run_ids) AND (state IS NOT NULL OR subject_ids <> '{}')
        """
    ),
    text(
        """
        UPDATE blackbox.effects
           SET idempotency_key = :shredded || ':' || intent_sequence,
               external_id = CASE WHEN external_id IS NULL THEN NULL ELSE :shredded END
         WHERE run_id = ANY(:run_ids)
           AND idempotency_key <> :shredded || ':' || intent_sequence
        """
    ),
]
# The actions of the deletion ledger that destroyed a run's bodies (or found none to
# destroy): each was done with the run's scrub, so a copy of the run must carry it too.
_SHREDDED_RUNS = text(
    """
    SELECT DISTINCT run_id FROM blackbox.deletion_ledger
     WHERE action IN ('shred_keys', 'unencrypted', 'reapply') ORDER BY run_id
    """
)
_LEDGER_KEYS = text(
    """
    SELECT DISTINCT unnest(key_ids) FROM blackbox.deletion_ledger
     WHERE run_id = :run_id AND action IN ('shred_keys', 'reapply')
    """
)
# A views database may be one without the write side, or read as a role without the
# ledger: then it cannot confirm a deletion, and asking must not abort the transaction.
_LEDGER_READABLE = text(
    """
    SELECT COALESCE(has_table_privilege(to_regclass('blackbox.deletion_ledger'), 'SELECT'),
                    false)
    """
)
_RUN_HEAD = text(
    "SELECT tenant_id, last_sequence, chain_head FROM blackbox.runs WHERE run_id = :run_id"
)
_RUN_HEADS = text(
    "SELECT run_id, tenant_id, last_sequence, chain_head FROM blackbox.runs "
    "WHERE run_id = ANY(CAST(:run_ids AS text[]))"
)
# As for the ledger: a views database without the write side (or a role that may not
# read it) cannot vouch for runs, and asking must not abort the transaction.
_RUNS_READABLE = text(
    """
    SELECT COALESCE(has_table_privilege(to_regclass('blackbox.runs'), 'SELECT'), false)
    """
)


def scrub_run_txn(conn: Connection, run_id: str) -> None:
    """Replace what the run row and the effect rows of ``run_id`` hold in clear of the
    agent's values (``runs.state`` and ``subject_ids`` are emptied; effects' idempotency
    keys and external ids become :data:`SHREDDED` placeholders), in the caller's
    transaction: the shredding one, so nothing the destroyed keys protected outlives
    them here."""
    scrub_runs_txn(conn, [run_id])


def scrub_runs_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """:func:`scrub_run_txn` for every run of ``run_ids``, in the caller's transaction."""
    if not run_ids:
        return
    for statement in _SCRUB:
        conn.execute(statement, {"run_ids": list(run_ids), "shredded": SHREDDED})


def shredded_runs_txn(conn: Connection) -> list[str]:
    """The runs whose bodies this database's deletion ledger says were destroyed (by a
    shredding, a re-application, or a forget of a run recorded unencrypted): the runs a
    restored copy must hold scrubbed (:func:`scrub_runs_txn`)."""
    return [str(r) for r in conn.execute(_SHREDDED_RUNS).scalars()]


_UNSCRUBBED = text(
    """
    SELECT r.run_id FROM blackbox.runs r
     WHERE r.run_id = ANY(:run_ids)
       AND (r.state IS NOT NULL OR r.subject_ids <> '{}'
            OR EXISTS (SELECT 1 FROM blackbox.effects e
                        WHERE e.run_id = r.run_id
                          AND (e.idempotency_key <> :shredded || ':' || e.intent_sequence
                               OR e.external_id <> :shredded)))
     ORDER BY r.run_id
    """
)


def unscrubbed_runs_txn(conn: Connection, run_ids: Sequence[str]) -> list[str]:
    """The runs of ``run_ids`` whose row or effects still hold a value the shredding
    scrub replaces (a drill's check that a restore scrubbed what the ledger names)."""
    params = {"run_ids": list(run_ids), "shredded": SHREDDED}
    return [str(r) for r in conn.execute(_UNSCRUBBED, params).scalars()]


def scrub_shredded_runs_txn(conn: Connection) -> list[str]:
    """Apply the shredding scrub (:func:`scrub_runs_txn`) to every run the deletion
    ledger names as shredded, in the caller's transaction; those runs. A restore calls
    it in the transaction that writes the restored rows, so a copy never holds, even
    for a moment, what ``forget`` scrubbed from the original."""
    run_ids = shredded_runs_txn(conn)
    scrub_runs_txn(conn, run_ids)
    return run_ids


def ledger_key_ids_txn(conn: Connection, run_id: str) -> frozenset[str]:
    """The data keys of ``run_id`` that this database's deletion ledger says were
    destroyed (by a shredding or a re-application)."""
    return frozenset(str(k) for k in conn.execute(_LEDGER_KEYS, {"run_id": run_id}).scalars())


def ledger_readable_txn(conn: Connection) -> bool:
    """Whether this database holds the write side's deletion ledger and the session may
    read it (so :func:`ledger_key_ids_txn` can confirm a destruction)."""
    return bool(conn.execute(_LEDGER_READABLE).scalar())


def run_head_txn(conn: Connection, run_id: str) -> RunHead | None:
    """The tenant and chain head ``blackbox.runs`` holds for ``run_id``; None when the
    database does not know the run."""
    row = conn.execute(_RUN_HEAD, {"run_id": run_id}).first()
    if row is None:
        return None
    return RunHead(str(row.tenant_id), int(row.last_sequence), str(row.chain_head))


def run_heads_txn(conn: Connection, run_ids: Sequence[str]) -> dict[str, RunHead]:
    """The tenant and chain head ``blackbox.runs`` holds for each of ``run_ids`` it
    knows (one statement, by primary key); a run it does not know is left out."""
    if not run_ids:
        return {}
    rows = conn.execute(_RUN_HEADS, {"run_ids": list(run_ids)})
    return {
        str(r.run_id): RunHead(str(r.tenant_id), int(r.last_sequence), str(r.chain_head))
        for r in rows
    }


_EPOCHS_READABLE = text(
    """
    SELECT COALESCE(
        has_function_privilege(to_regprocedure('blackbox.lease_epochs()'), 'EXECUTE'), false
    )
    """
)
_EPOCHS = text("SELECT shard, epoch FROM blackbox.lease_epochs()")


def lease_epochs_txn(conn: Connection) -> dict[int, int] | None:
    """Each outbox shard's newest lease epoch, as the write side granted it (a relay
    stamps its messages with the epoch it holds, never a later one); None when this
    database has no write side or the session may not ask it."""
    if not conn.execute(_EPOCHS_READABLE).scalar():
        return None
    return {int(shard): int(epoch) for shard, epoch in conn.execute(_EPOCHS)}


def lease_epochs(engine: Engine) -> dict[int, int] | None:
    """:func:`lease_epochs_txn` in a connection of its own (a reader's fence asks it)."""
    with engine.connect() as conn:
        return lease_epochs_txn(conn)


def runs_readable_txn(conn: Connection) -> bool:
    """Whether this database holds the write side's runs table and the session may read
    it (so :func:`run_heads_txn` can say which runs and sequences the write side holds)."""
    return bool(conn.execute(_RUNS_READABLE).scalar())
