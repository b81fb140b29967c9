"""Turns boundary crossings into envelopes and appends them in the caller's transaction.

The functions ending in ``_txn`` take a caller-owned connection and never commit: that
is what lets an agent's own state change and its events commit together. Each append
is one statement that advances the run row (sequence and chain head, guarded by the
sequence the writer expects) and inserts the outbox row only when the guard held.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._errors import PayloadTooLarge
from agent_blackbox.outbox._tracing import current_trace
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    DataKey,
    Digester,
    Envelope,
    EnvelopeCodec,
    PayloadContext,
    PayloadPipeline,
    Settings,
    digest,
    digest_bytes,
)


def shard_of(run_id: str, shards: int) -> int:
    """The outbox shard of a run: stable across processes and releases."""
    return zlib.crc32(run_id.encode("utf-8")) % shards


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """What every envelope of a run repeats."""

    run_id: str
    tenant_id: str
    agent_id: str
    shard: int
    subject_ids: tuple[str, ...] = ()
    classification: str = "internal"
    retention_class: str = "standard"
    data_key: DataKey | None = field(default=None, repr=False, compare=False)
    """The run's data key while this writer records it (encrypted runs only)."""
    digest: Digester = field(default=digest, repr=False, compare=False)
    """How the run's input and output digests are taken (keyed for sensitive classes)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last sequence and chain head of a run, as the writer believes them to be."""

    sequence: int = 0
    chain_head: str = GENESIS_CHAIN_HASH


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    """An envelope ready to append, with its encoding and any out-of-line body."""

    envelope: Envelope
    encoded: bytes
    blob: tuple[str, bytes] | None
    status: str | None = None
    """The run status to set with this event (only ``run.finished`` sets one)."""

    @property
    def cursor(self) -> Cursor:
        """The cursor after this event is appended."""
        return Cursor(self.envelope.sequence, self.envelope.chain_hash)


class EventFactory:
    """Builds envelopes: digests, the payload pipeline, out-of-line bodies, the chain."""

    def __init__(
        self,
        *,
        settings: Settings,
        pipeline: PayloadPipeline,
        codec: EnvelopeCodec,
        clock: Callable[[], datetime],
    ) -> None:
        self._settings = settings
        self._pipeline = pipeline
        self._codec = codec
        self._clock = clock

    def prepare(
        self, identity: RunIdentity, cursor: Cursor, crossing: Crossing, *, event_id: str
    ) -> PreparedEvent:
        """The next event of the run after ``cursor``.

        Raises:
            NotSerialisable: an input or output is not JSON.
            BodyEncodingError: the body does not fit its schema.
            PayloadTooLarge: the body is over ``max_payload_bytes``.
        """
        sequence = cursor.sequence + 1
        context = PayloadContext(
            identity.run_id, sequence, event_id, identity.tenant_id, data_key=identity.data_key
        )
        sealed = self._pipeline.pack(crossing.event_type, crossing.version, crossing.body, context)
        size = len(sealed.data)
        if size > self._settings.max_payload_bytes:
            raise PayloadTooLarge(crossing.event_type, size, self._settings.max_payload_bytes)
        blob = None
        payload: bytes | None = sealed.data
        payload_ref = None
        if size > self._settings.blob_threshold_bytes:
            payload_ref = digest_bytes(sealed.data)
            blob = (payload_ref, sealed.data)
            payload = None
        trace = current_trace()
        unchained = Envelope(
            event_id=event_id,
            run_id=identity.run_id,
            sequence=sequence,
            event_type=crossing.event_type,
            body_version=crossing.version,
            recorded_at=self._clock(),
            tenant_id=identity.tenant_id,
            agent_id=identity.agent_id,
            subject_ids=identity.subject_ids,
            trace_id=trace.trace_id,
            span_id=trace.span_id,
            parent_span_id=trace.parent_span_id,
            input_digest=crossing.input_digest or identity.digest(crossing.input, path="input"),
            output_digest=identity.digest(crossing.output, path="output"),
            chain_hash="",
            payload=payload,
            payload_ref=payload_ref,
            payload_encoding=sealed.encoding,
            key_id=sealed.key_id,
            classification=identity.classification,
            retention_class=identity.retention_class,
            attributes=crossing.attributes,
        )
        envelope = _with_chain_hash(unchained, cursor.chain_head)
        status = (
            crossing.attributes.get("status") if crossing.event_type == "run.finished" else None
        )
        return PreparedEvent(envelope, self._codec.encode(envelope), blob, status)


def _with_chain_hash(envelope: Envelope, previous: str) -> Envelope:
    values = {name: getattr(envelope, name) for name in Envelope.__dataclass_fields__}
    values["chain_hash"] = envelope.expected_chain_hash(previous)
    return Envelope(**values)


def new_event_id() -> str:
    """A fresh, globally unique event id."""
    return str(uuid.uuid4())


_INSERT_RUN = text(
    """
    INSERT INTO blackbox.runs
        (run_id, tenant_id, agent_id, subject_ids, chain_head, parent_run_id, code_version,
         classification, retention_class)
    VALUES
        (:run_id, :tenant_id, :agent_id, :subject_ids, :chain_head, :parent_run_id, :code_version,
         :classification, :retention_class)
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

_INSERT_BLOB = text(
    """
    INSERT INTO blackbox.blobs (digest, data, size) VALUES (:digest, :data, :size)
    ON CONFLICT (digest) DO NOTHING
    """
)

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


def insert_run_plan(
    identity: RunIdentity, *, parent_run_id: str | None, code_version: str
) -> tuple[TextClause, dict[str, Any]]:
    """The statement that creates the run row (sequence 0, genesis chain head)."""
    return _INSERT_RUN, {
        "run_id": identity.run_id,
        "tenant_id": identity.tenant_id,
        "agent_id": identity.agent_id,
        "subject_ids": list(identity.subject_ids),
        "chain_head": GENESIS_CHAIN_HASH,
        "parent_run_id": parent_run_id,
        "code_version": code_version,
        "classification": identity.classification,
        "retention_class": identity.retention_class,
    }


Plan = list[tuple[TextClause, dict[str, Any]]]


def append_plan(identity: RunIdentity, event: PreparedEvent) -> tuple[Plan, Plan]:
    """The statements that append ``event``: those up to and including the guarded
    append, whose rowcount says if the guard held, and those to run only if it did."""
    before: Plan = []
    if event.blob is not None:
        ref, data = event.blob
        before.append((_INSERT_BLOB, {"digest": ref, "data": data, "size": len(data)}))
    envelope = event.envelope
    state = (
        envelope.attributes.get("to_state") if envelope.event_type == "state.transition" else None
    )
    before.append(
        (
            _APPEND,
            {
                "run_id": identity.run_id,
                "shard": identity.shard,
                "sequence": envelope.sequence,
                "previous": envelope.sequence - 1,
                "chain_hash": envelope.chain_hash,
                "status": event.status,
                "state": state,
                "event_id": envelope.event_id,
                "envelope": event.encoded,
            },
        )
    )
    return before, _effect_plan(envelope)


def _effect_plan(envelope: Envelope) -> Plan:
    attributes = envelope.attributes
    keys = {"run_id": envelope.run_id, "idempotency_key": attributes.get("idempotency_key")}
    if envelope.event_type == "effect.intent":
        return [(_INTENT, {**keys, "effect": attributes["effect"], "sequence": envelope.sequence})]
    if envelope.event_type == "effect.receipt":
        status = {"status": attributes["status"], "external_id": attributes.get("external_id")}
        return [(_RECEIPT, {**keys, **status})]
    return []


def append_txn(conn: Connection, identity: RunIdentity, event: PreparedEvent) -> bool:
    """Append ``event`` in the caller's transaction; False when the run moved on."""
    before, after = append_plan(identity, event)
    rowcount = 0
    for statement, params in before:
        rowcount = conn.execute(statement, params).rowcount
    if rowcount != 1:
        return False
    for statement, params in after:
        conn.execute(statement, params)
    return True


async def append_txn_async(
    conn: AsyncConnection, identity: RunIdentity, event: PreparedEvent
) -> bool:
    """:func:`append_txn` for an async connection."""
    before, after = append_plan(identity, event)
    rowcount = 0
    for statement, params in before:
        rowcount = (await conn.execute(statement, params)).rowcount
    if rowcount != 1:
        return False
    for statement, params in after:
        await conn.execute(statement, params)
    return True


def load_cursor_txn(conn: Connection, run_id: str) -> Cursor | None:
    """The run's cursor as committed (or as this transaction sees it)."""
    row = conn.execute(_LOAD_CURSOR, {"run_id": run_id}).first()
    return None if row is None else Cursor(int(row[0]), str(row[1]))


async def load_cursor_txn_async(conn: AsyncConnection, run_id: str) -> Cursor | None:
    """:func:`load_cursor_txn` for an async connection."""
    row = (await conn.execute(_LOAD_CURSOR, {"run_id": run_id})).first()
    return None if row is None else Cursor(int(row[0]), str(row[1]))
