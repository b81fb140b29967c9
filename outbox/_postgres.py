"""The event log in Postgres: the run row, the outbox, blobs and effects, written in the
caller's transaction or in the log's own, for the sync and the async recorder alike.

What to execute is written once, as plans: generators that yield statements and receive
their results (the ``_txn`` functions and the recorders drive the same plans). A plan
never commits; that is what lets an agent's own state change and its events commit
together. Each append is one statement that advances the run row (sequence and chain
head, guarded by the sequence the writer expects) and inserts the outbox row only when
the guard held.

A recorder writes only through the schema's SECURITY DEFINER functions
(``blackbox.start_run``, ``append_event``, ``take_over_run``, see migration 0004;
``append_events`` for a group flush, migration 0009): each
run has a writer credential, made here and known to the database only by its SHA-256,
so a writer appends to the runs it started, for the tenants granted to its role, and
never rewrites history. Jobs that run as the schema's owner (a redaction note) append
with the plain guarded statement.

The sync driver (:class:`PostgresLog`) executes a plan on a ``Connection``, the async one
(:class:`AsyncPostgresLog`) awaits each statement on an ``AsyncConnection``; both retry a
transaction they own on a lost connection or a serialisation failure, with the same
policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._core import APPEND_ATTEMPTS, RunCore, StartPlan
from agent_blackbox.outbox._direct import DirectTransactions
from agent_blackbox.outbox._errors import DatabaseUnavailable, RunNotActive
from agent_blackbox.outbox._failures import (
    TRANSIENT_RETRIES,
    naming,
    refusal,
    retry_delay,
    unavailable,
)
from agent_blackbox.outbox._group import Batch
from agent_blackbox.outbox._metrics import counting_failures
from agent_blackbox.outbox._recovery import PendingEffect, StoredRun
from agent_blackbox.outbox._stepper import Stepper
from agent_blackbox.outbox._writer import (
    Cursor,
    PreparedEvent,
    RunIdentity,
    new_credential,
    shard_of,
)
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    DataKey,
    Digester,
    Envelope,
    PermissionRefused,
    permission_refused,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
    from sqlalchemy.orm import Session

    Joinable: TypeAlias = Connection | Session
    """A transaction of the caller's that events may join."""

T = TypeVar("T")
Statement = tuple[TextClause, dict[str, Any]]
Plan = Generator[Statement, Any, T]
"""Statements to execute in order; each receives its result, the plan returns a value."""
_Stage = Literal["connecting", "working", "committing"]
"""Where an attempt of a transaction of the log's own was when it failed."""

_START_RUN = text(
    """
    SELECT blackbox.start_run(
        :run_id, :tenant_id, :agent_id, CAST(:subject_ids AS text[]), :chain_head,
        :parent_run_id, :code_version, :classification, :retention_class, :credential_hash)
    """
)

_TAKE_OVER = text("SELECT blackbox.take_over_run(:run_id, :credential_hash)")

_APPEND_AS_WRITER = text(
    """
    SELECT blackbox.append_event(
        :run_id, :credential, CAST(:shard AS smallint), :sequence, :chain_hash, :status,
        :state, CAST(:event_id AS uuid), :envelope, :key_id, :effect, :effect_key,
        :effect_status, :external_id, :event_type, :body_version, :recorded_at)
    """
)

_APPEND = text(
    """
    WITH advanced AS (
        UPDATE blackbox.runs
           SET last_sequence = :sequence,
               chain_head = :chain_hash,
               status = COALESCE(:status, status),
               state = COALESCE(:state, state),
               updated_at = now()
         WHERE run_id = :run_id AND last_sequence = :previous
     RETURNING run_id
    )
    INSERT INTO blackbox.outbox (shard, run_id, sequence, event_id, envelope)
    SELECT :shard, run_id, :sequence, CAST(:event_id AS uuid), :envelope FROM advanced
    """
)

# A group flush: every event of the batch in one call (migration 0009), which appends
# them all or, when the run was not at the sequence before the first, none (0).
_APPEND_BATCH = text(
    """
    SELECT blackbox.append_events(
        :run_id, :credential, CAST(:shard AS smallint), CAST(:sequences AS bigint[]),
        CAST(:chain_hashes AS text[]), CAST(:event_ids AS uuid[]), CAST(:envelopes AS bytea[]),
        CAST(:key_ids AS text[]), CAST(:event_types AS text[]),
        CAST(:body_versions AS integer[]), CAST(:recorded_ats AS bigint[]))
    """
)
_BATCH_ARRAYS = (
    "sequences",
    "chain_hashes",
    "event_ids",
    "envelopes",
    "key_ids",
    "event_types",
    "body_versions",
    "recorded_ats",
)
"""The array parameters of a group flush, sent in binary format (see ``_direct.py``)."""
_SAVEPOINT = text("SAVEPOINT blackbox_flush")
_BACK_TO_SAVEPOINT = text("ROLLBACK TO SAVEPOINT blackbox_flush")

_INSERT_BLOB = text("SELECT blackbox.store_blob(:tenant, :digest, :data)")

_INTENT = text(
    """
    INSERT INTO blackbox.effects (run_id, idempotency_key, effect, intent_sequence)
    VALUES (:run_id, :idempotency_key, :effect, :sequence)
    """
)

_RECEIPT = text(
    """
    UPDATE blackbox.effects
       SET status = :status, external_id = :external_id, updated_at = now()
     WHERE run_id = :run_id AND idempotency_key = :idempotency_key
    """
)

_LOAD_CURSOR = text("SELECT last_sequence, chain_head FROM blackbox.runs WHERE run_id = :run_id")

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

# The copy of one of the login's granted tenants (any, for the owner): the bytes of every
# copy are the same (content-addressed).
_BLOB = text("SELECT blackbox.read_blob(:digest)")
_PENDING = text(
    "SELECT count(*) FROM blackbox.outbox "
    "WHERE CAST(:run_ids AS text[]) IS NULL OR run_id = ANY(:run_ids)"
)


# Plans ------------------------------------------------------------------------------


def create_plan(start: StartPlan) -> Plan[Envelope]:
    """Create the run row (sequence 0, genesis chain head), store its data key, append
    ``run.started``."""
    identity = start.core.identity
    try:
        created = yield (
            _START_RUN,
            {
                "credential_hash": _credential_hash(identity),
                "run_id": identity.run_id,
                "tenant_id": identity.tenant_id,
                "agent_id": identity.agent_id,
                "subject_ids": list(identity.subject_ids),
                "chain_head": GENESIS_CHAIN_HASH,
                "parent_run_id": start.parent_run_id,
                "code_version": start.code_version,
                "classification": identity.classification,
                "retention_class": identity.retention_class,
            },
        )
    except IntegrityError as exc:
        raise start.exists() from exc
    if not created.scalar_one():
        # This writer's own run: an earlier attempt committed it, with its first event.
        return start.core.advanced(start.first)
    if start.store_key is not None:
        yield _with_credential(start.store_key, identity)
    attempt = Attempt(start.first)
    return (yield from append_plan(start.core, start.crossing, start.event_id, attempt=attempt))


@dataclass(slots=True)
class Attempt:
    """The event an append is trying to write, kept across the transaction's retries: its
    id, recorded time and chain hash are fixed before the first try, so a retry after an
    ambiguous commit finds that very event at the run's head and does not append it again.
    """

    event: PreparedEvent


def append_plan(
    core: RunCore,
    crossing: Crossing,
    event_id: str,
    *,
    attempt: Attempt,
) -> Plan[Envelope]:
    """Append ``crossing`` as the run's next event (``attempt`` holds it, prepared before
    the first try), re-reading the run when its guard fails (a retried transaction whose
    first attempt committed finds itself there)."""
    for _ in range(APPEND_ATTEMPTS):
        event = attempt.event
        if (yield from _guarded_append(core.identity, event)):
            return core.advanced(event)
        row = (yield _LOAD_CURSOR, {"run_id": core.run_id}).first()
        committed = None if row is None else Cursor(int(row[0]), str(row[1]))
        if core.stale(event, committed):
            return event.envelope
        attempt.event = core.prepare(crossing, event_id)
    raise core.conflict()


def flush_plan(core: RunCore, batch: Batch) -> Plan[None]:
    """Append the buffered events of ``batch`` (group commit), all or none.

    1. Under a savepoint, append every event: in one call of ``append_events``, which
       writes all or none, or (the owner's path, without a writer credential) one
       guarded statement each.
    2. When not all of them were appended (the run is not where this writer left it),
       undo whatever was, and re-read the run's head.
    3. When the head is one of the batch's events, an earlier flush committed the batch
       up to it (the writer never heard back): done, or go back to 1 with the rest.
       Otherwise prepare the batch again after the head (as a per-event append does)
       and go back to 1; a batch written behind its run (the run's next events are
       prepared on it) is left as it is and marked moved, for the run to prepare again.
    """
    for _ in range(APPEND_ATTEMPTS):
        yield _SAVEPOINT, {}
        appended = yield from _append_batch(core.identity, batch.events)
        if appended == len(batch.entries):
            return
        if appended:  # later guards held after earlier ones failed: not this history
            yield _BACK_TO_SAVEPOINT, {}
        row = (yield _LOAD_CURSOR, {"run_id": core.run_id}).first()
        if row is None:
            raise RunNotActive(f"run {core.run_id} does not exist in the database")
        committed = Cursor(int(row[0]), str(row[1]))
        done = batch.committed(committed)
        if done == len(batch.entries):
            return
        if done:
            batch.drop(done)
        elif not batch.rebase(core, committed):
            return  # moved: nothing of it is written
    raise core.conflict()


def _append_batch(identity: RunIdentity, events: list[PreparedEvent]) -> Plan[int]:
    """How many of ``events`` were appended, in order: all or none under a writer
    credential (the batch function checks each event as ``append_event`` does), else
    each under its own guard."""
    for event in events:
        if event.blob is not None:
            yield _store_blob(identity, event.blob)
    if identity.credential is None:  # the owner's path: one guarded statement each
        count = 0
        for event in events:
            count += bool((yield from _guarded_append(identity, event)))
        return count
    envelopes = [event.envelope for event in events]
    appended = yield (
        _APPEND_BATCH,
        {
            "run_id": identity.run_id,
            "credential": identity.credential,
            "shard": identity.shard,
            "sequences": [e.sequence for e in envelopes],
            "chain_hashes": [e.chain_hash for e in envelopes],
            "event_ids": [e.event_id for e in envelopes],
            "envelopes": [event.encoded for event in events],
            "key_ids": [e.key_id for e in envelopes],
            "event_types": [str(e.event_type) for e in envelopes],
            "body_versions": [e.body_version for e in envelopes],
            "recorded_ats": [e.recorded_at_us for e in envelopes],
        },
    )
    return int(appended.scalar_one())


def _guarded_append(identity: RunIdentity, event: PreparedEvent) -> Plan[bool]:
    """The statements of one append; False when the run moved on (nothing was written
    but an out-of-line body, which is content-addressed)."""
    envelope = event.envelope
    if event.blob is not None:
        yield _store_blob(identity, event.blob)
    is_transition = envelope.event_type == "state.transition"
    row = {
        "run_id": identity.run_id,
        "shard": identity.shard,
        "sequence": envelope.sequence,
        "chain_hash": envelope.chain_hash,
        "status": event.status,
        "state": envelope.attributes.get("to_state") if is_transition else None,
        "event_id": envelope.event_id,
        "envelope": event.encoded,
    }
    if identity.credential is not None:
        appended = yield (
            _APPEND_AS_WRITER,
            {**row, **_effect_row(event), **_as_writer(envelope, identity)},
        )
        return bool(appended.scalar_one())
    appended = yield _APPEND, {**row, "previous": envelope.sequence - 1}
    if appended.rowcount != 1:
        return False
    effect = _effect_row(event)  # the owner's path writes the effects row itself
    keys = {"run_id": envelope.run_id, "idempotency_key": effect["effect_key"]}
    if effect["effect_key"] is not None and effect["effect"] is not None:
        yield _INTENT, {**keys, "effect": effect["effect"], "sequence": envelope.sequence}
    elif effect["effect_key"] is not None:
        status = {"status": effect["effect_status"], "external_id": effect["external_id"]}
        yield _RECEIPT, {**keys, **status}
    return True


def _store_blob(identity: RunIdentity, blob: tuple[str, bytes]) -> Statement:
    """Store a body out of line as the run's tenant's (only its replayers read it)."""
    ref, data = blob
    return _INSERT_BLOB, {"tenant": identity.tenant_id, "digest": ref, "data": data}


def _stands_alone(identity: RunIdentity, event: PreparedEvent) -> bool:
    """Whether every write of appending ``event`` is the one ``append_event`` call, which
    holds together without a transaction around it (no out-of-line body stored first,
    no owner's path with its separate effects row)."""
    return identity.credential is not None and event.blob is None


def _effect_row(event: PreparedEvent) -> dict[str, Any]:
    """What ``append_event`` writes to ``blackbox.effects`` with this event."""
    envelope = event.envelope
    attributes = event.given_attributes
    is_intent = envelope.event_type == "effect.intent"
    is_receipt = envelope.event_type == "effect.receipt"
    return {
        "effect_key": attributes.get("idempotency_key") if is_intent or is_receipt else None,
        "effect": attributes.get("effect") if is_intent else None,
        "effect_status": attributes.get("status") if is_receipt else None,
        "external_id": attributes.get("external_id") if is_receipt else None,
    }


def _as_writer(envelope: Envelope, identity: RunIdentity) -> dict[str, Any]:
    """The writer's credential, and the envelope fields ``append_event`` checks its bytes
    against (with the run, sequence and event id)."""
    return {
        "credential": identity.credential,
        "key_id": envelope.key_id,
        "event_type": str(envelope.event_type),
        "body_version": envelope.body_version,
        "recorded_at": envelope.recorded_at_us,
    }


def _credential_hash(identity: RunIdentity) -> bytes:
    if identity.credential is None:
        raise ValueError(f"run {identity.run_id}: a writer needs a credential")
    return hashlib.sha256(identity.credential).digest()


def _with_credential(statement: Statement, identity: RunIdentity) -> Statement:
    """A data key's store statement, with the credential that lets this writer store it."""
    clause, params = statement
    return clause, {**params, "credential": identity.credential}


def stored_run_plan(run_id: str, *, shards: int) -> Plan[StoredRun]:
    """The stored identity, cursor, status and state of ``run_id``.

    Raises:
        RunNotActive: no such run.
    """
    row = (yield _RUN, {"run_id": run_id}).first()
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
    cursor = Cursor(int(row.last_sequence), row.chain_head)
    return StoredRun(identity, cursor, row.status, row.state)


def resume_plan(
    run_id: str, *, shards: int, keys: DataKeyStore | None
) -> Plan[tuple[StoredRun, DataKey | None]]:
    """The stored run, and (for a running run, when ``keys`` encrypt) a new data key for
    the writer that carries it on, stored in the same transaction. The first writer's key
    stays with the writer that died: an agent never reads a key back from the store."""
    stored = yield from stored_run_plan(run_id, shards=shards)
    if stored.status != "running":
        return stored, None
    identity = replace(stored.identity, credential=new_credential())
    yield _TAKE_OVER, {"run_id": run_id, "credential_hash": _credential_hash(identity)}
    stored = replace(stored, identity=identity)
    if keys is None:
        return stored, None
    data_key, store_key = keys.new_key(run_id, identity.tenant_id)
    yield _with_credential(store_key, identity)
    return stored, data_key


def unresolved_plan(*, run_id: str | None, limit: int) -> Plan[list[PendingEffect]]:
    """Effects still waiting for a receipt, oldest first."""
    rows = (yield _UNRESOLVED, {"run_id": run_id, "limit": limit}).all()
    return [PendingEffect(*row) for row in rows]


# Driving plans ----------------------------------------------------------------------


def execute(conn: Connection, plan: Plan[T]) -> T:
    """Run ``plan`` on ``conn``; an integrity error goes back into the plan, which decides
    what it means; a refusal of the write functions becomes the writer's error."""
    walk = Stepper(plan)
    while (statement := walk.next()) is not None:
        try:
            walk.reply(conn.execute(*statement))
        except IntegrityError as exc:
            walk.fail(exc)
        except DBAPIError as exc:
            raise refusal(exc) or exc from exc
    return walk.result()


async def execute_async(conn: AsyncConnection, plan: Plan[T]) -> T:
    """:func:`execute` on an async connection."""
    walk = Stepper(plan)
    while (statement := walk.next()) is not None:
        try:
            walk.reply(await conn.execute(*statement))
        except IntegrityError as exc:
            walk.fail(exc)
        except DBAPIError as exc:
            raise refusal(exc) or exc from exc
    return walk.result()


def load_run_txn(conn: Connection, run_id: str, *, shards: int) -> StoredRun:
    """The stored identity and cursor of ``run_id``, in the caller's transaction.

    Raises:
        RunNotActive: no such run.
    """
    return execute(conn, stored_run_plan(run_id, shards=shards))


def append_txn(conn: Connection, identity: RunIdentity, event: PreparedEvent) -> bool:
    """Append ``event`` in the caller's transaction; False when the run moved on."""
    return execute(conn, _guarded_append(identity, event))


def pending_events_txn(conn: Connection, run_ids: Sequence[str] | None = None) -> int:
    """How many events wait in the outbox for the relay (of ``run_ids``, or of every run)."""
    params = {"run_ids": None if run_ids is None else list(run_ids)}
    return int(conn.execute(_PENDING, params).scalar_one())


_BACKLOG = text("SELECT count(*), extract(epoch FROM now() - min(created_at)) FROM blackbox.outbox")


def outbox_backlog_txn(conn: Connection) -> tuple[int, float]:
    """How many events wait in the outbox, and how long the oldest has waited (seconds;
    0 when none waits)."""
    count, age = conn.execute(_BACKLOG).one()
    return int(count), max(float(age or 0.0), 0.0)


def read_blob_txn(conn: Connection, ref: str) -> bytes | None:
    """The body stored out of line under ``ref``, or None."""
    data = conn.execute(_BLOB, {"digest": ref}).scalar()
    return None if data is None else bytes(data)


# The logs ---------------------------------------------------------------------------


class PostgresLog:
    """The sync recorder's event log: plans executed in the caller's transaction or in
    one of the log's own, retried when transient."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._direct = DirectTransactions.of(engine, binary={_APPEND_BATCH: _BATCH_ARRAYS})

    def run(
        self,
        plan: Callable[[], Plan[T]],
        connection: Joinable | None = None,
        *,
        autocommit: bool = False,
    ) -> T:
        """A fresh ``plan()`` executed in the caller's transaction, or in one of the log's
        own: on the pool's DB-API connection (``_direct.py``; in ``autocommit`` when
        its writes are one self-contained statement) unless someone listens to the
        engine's statements."""
        direct = self._direct
        if connection is None and direct is not None and not direct.watched:
            return direct.transact(plan, autocommit=autocommit)
        return self.transact(lambda conn: execute(conn, plan()), connection)

    def transact(self, work: Callable[[Connection], T], connection: Joinable | None = None) -> T:
        """Run ``work`` in the caller's transaction, or in a new one with retries (a joined
        transaction belongs to the caller, who decides)."""
        ambiguous = False  # kept across attempts (see _failures.unavailable)
        try:
            if connection is not None:
                joined = (
                    connection if isinstance(connection, Connection) else connection.connection()
                )
                return work(joined)
            for attempt in range(TRANSIENT_RETRIES):
                stage: _Stage = "connecting"
                try:
                    with self.engine.begin() as conn:
                        stage = "working"
                        result = work(conn)
                        stage = "committing"
                    return result
                except DBAPIError as exc:
                    ambiguous = ambiguous or stage == "committing"
                    connecting = stage == "connecting"
                    delay = retry_delay(exc, attempt, ambiguous=ambiguous, connecting=connecting)
                    time.sleep(delay)  # back off before a fresh attempt
        except SQLAlchemyError as exc:
            raise unavailable(exc, ambiguous=ambiguous) from exc
        raise AssertionError("unreachable")

    def create(self, start: StartPlan, connection: Joinable | None) -> Envelope:
        with counting_failures(), naming(lambda: start.first):
            return self.run(lambda: create_plan(start), connection)

    def append(
        self, core: RunCore, crossing: Crossing, event_id: str, connection: Joinable | None
    ) -> Envelope:
        with counting_failures():
            attempt = Attempt(core.prepare(crossing, event_id))
            with naming(lambda: attempt.event):
                return self.run(
                    lambda: append_plan(core, crossing, event_id, attempt=attempt),
                    connection,
                    autocommit=_stands_alone(core.identity, attempt.event),
                )

    def flush(self, core: RunCore, batch: Batch) -> None:
        """Append a run's buffered events in one transaction of the log's own."""
        with counting_failures():
            self.run(lambda: flush_plan(core, batch))

    def resume(
        self, run_id: str, *, shards: int, keys: DataKeyStore | None
    ) -> tuple[StoredRun, DataKey | None]:
        return self.transact(
            lambda conn: execute(conn, resume_plan(run_id, shards=shards, keys=keys))
        )

    def unresolved_effects(self, *, run_id: str | None, limit: int) -> list[PendingEffect]:
        return self.transact(
            lambda conn: execute(conn, unresolved_plan(run_id=run_id, limit=limit))
        )

    def tenant_digest(self, keys: DataKeyStore, tenant_id: str) -> Digester:
        return self.transact(lambda conn: keys.tenant_digest_txn(conn, tenant_id))


class AsyncPostgresLog:
    """:class:`PostgresLog` for asyncio: the same plans, each statement awaited."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def transact(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        connection: AsyncConnection | None = None,
    ) -> T:
        """See :meth:`PostgresLog.transact`."""
        ambiguous = False
        try:
            if connection is not None:
                return await work(connection)
            for attempt in range(TRANSIENT_RETRIES):
                stage: _Stage = "connecting"
                try:
                    async with self.engine.begin() as conn:
                        stage = "working"
                        result = await work(conn)
                        stage = "committing"
                    return result
                except DBAPIError as exc:
                    ambiguous = ambiguous or stage == "committing"
                    connecting = stage == "connecting"
                    await asyncio.sleep(
                        retry_delay(exc, attempt, ambiguous=ambiguous, connecting=connecting)
                    )
        except SQLAlchemyError as exc:
            raise unavailable(exc, ambiguous=ambiguous) from exc
        raise AssertionError("unreachable")

    async def create(self, start: StartPlan, connection: AsyncConnection | None) -> Envelope:
        with counting_failures(), naming(lambda: start.first):
            return await self.transact(
                lambda conn: execute_async(conn, create_plan(start)), connection
            )

    async def append(
        self, core: RunCore, crossing: Crossing, event_id: str, connection: AsyncConnection | None
    ) -> Envelope:
        attempt = Attempt(core.prepare(crossing, event_id))

        def work(conn: AsyncConnection) -> Awaitable[Envelope]:
            return execute_async(conn, append_plan(core, crossing, event_id, attempt=attempt))

        with counting_failures(), naming(lambda: attempt.event):
            return await self.transact(work, connection)

    async def flush(self, core: RunCore, batch: Batch) -> None:
        """See :meth:`PostgresLog.flush`."""
        with counting_failures():
            await self.transact(lambda conn: execute_async(conn, flush_plan(core, batch)))

    async def resume(
        self, run_id: str, *, shards: int, keys: DataKeyStore | None
    ) -> tuple[StoredRun, DataKey | None]:
        return await self.transact(
            lambda conn: execute_async(conn, resume_plan(run_id, shards=shards, keys=keys))
        )

    async def unresolved_effects(self, *, run_id: str | None, limit: int) -> list[PendingEffect]:
        return await self.transact(
            lambda conn: execute_async(conn, unresolved_plan(run_id=run_id, limit=limit))
        )

    async def tenant_digest(self, keys: DataKeyStore, tenant_id: str) -> Digester:
        return await self.transact(
            lambda conn: conn.run_sync(lambda sync: keys.tenant_digest_txn(sync, tenant_id))
        )


class PostgresBlobs:
    """Reads bodies stored out of line (``blackbox.blobs``) by their content address: the
    blob reader of a replay or a verification of runs from this database."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def read(self, ref: str) -> bytes:
        """The bytes stored under ``ref``.

        Raises:
            PermissionRefused: the login may not read bodies, or this one is stored
                before bodies had tenants and is the owner's until ``blackbox migrate``.
            DatabaseUnavailable: the blob is not there (for the login's tenants), or
                the database failed.
        """
        try:
            with self._engine.connect() as conn:
                data = read_blob_txn(conn, ref)
        except SQLAlchemyError as exc:
            if refusal := permission_refused(exc):
                hint = (
                    ""
                    if "before bodies had tenants" in refusal
                    else ": bodies stored out of line are read by a blackbox_replayer login "
                    "granted the run's tenant"
                )
                raise PermissionRefused(f"cannot read blob {ref}: {refusal}{hint}") from exc
            raise DatabaseUnavailable(f"cannot read blob {ref}: {exc}") from exc
        if data is None:
            raise DatabaseUnavailable(
                f"blob {ref} is not in blackbox.blobs for the tenants this login is granted"
            )
        return data
