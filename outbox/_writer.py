"""Turns boundary crossings into envelopes: digests, the payload pipeline, out-of-line
bodies and the hash chain. Where the envelopes then go is the event log's business
(``_postgres.py``, ``_memory.py``)."""

from __future__ import annotations

import os
import threading
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._errors import NotSerialisable, PayloadTooLarge
from agent_blackbox.outbox._llm import truncated_llm_call
from agent_blackbox.outbox._placement import placed_attributes
from agent_blackbox.outbox._tracing import current_trace
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    NEW_RUNS,
    Canonicalisation,
    DataKey,
    Digester,
    Envelope,
    EnvelopeCodec,
    EventType,
    PayloadContext,
    PayloadPipeline,
    Sealed,
    Settings,
    digest_bytes,
)

Truncate = Callable[..., Crossing]
"""Builds a crossing whose body fits under the ceiling: ``(crossing, *, body_bytes,
ceiling, canonical) -> Crossing``; its input and output (so its digests) must stay the
same, and the digests it writes into the body are taken over ``canonical``."""

_TRUNCATE: dict[str, Truncate] = {EventType.LLM_CALL: truncated_llm_call}

MAX_ENVELOPE_BYTES = 256 * 1024
"""The most an encoded envelope may take besides its body (which goes out of line past
``blob_threshold_bytes``): ids, names and attributes, a few hundred bytes as a rule. Far
under the topic's message size (a megabyte by default), so that no label makes an event
the relay cannot send."""
"""Bodies that are recorded truncated over the ceiling rather than refused: a model
reply is paid for once it came back."""


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
    digest: Digester = field(default=NEW_RUNS.digest, repr=False, compare=False)
    """How the run's input and output digests are taken (keyed for sensitive classes),
    and over which canonicalisation: its chain is taken over the same, and each of its
    envelopes names it."""
    credential: bytes | None = field(default=None, repr=False, compare=False)
    """The writer credential of this writer (the database keeps only its SHA-256): what
    lets it, and only it, append to the run. None for jobs that write as the schema's
    owner (a run's redaction note)."""


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
    effect_ids: dict[str, str] | None = None
    """An effect's idempotency key and external id as given, for ``blackbox.effects``
    (recovery asks the external system by them), when the envelope's clear attributes
    carry them scrubbed."""

    @property
    def given_attributes(self) -> dict[str, str]:
        """The envelope's attributes with the effect ids as the agent gave them: what the
        log's own rows (``blackbox.effects``) are written from."""
        if self.effect_ids is None:
            return self.envelope.attributes
        return {**self.envelope.attributes, **self.effect_ids}

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

    @property
    def settings(self) -> Settings:
        return self._settings

    def prepare(
        self, identity: RunIdentity, cursor: Cursor, crossing: Crossing, *, event_id: str
    ) -> PreparedEvent:
        """The next event of the run after ``cursor``.

        Raises:
            NotSerialisable: an input or output is not JSON.
            BodyEncodingError: the body does not fit its schema.
            PayloadTooLarge: the body is over ``max_blob_bytes`` and its kind of event
                cannot be recorded truncated.
        """
        sequence = cursor.sequence + 1
        context = PayloadContext(
            identity.run_id,
            sequence,
            event_id,
            identity.tenant_id,
            data_key=identity.data_key,
            event_type=crossing.event_type,
            body_version=crossing.version,
        )
        canonical = identity.digest.canonical
        crossing, sealed = self._packed(crossing, context, canonical)
        size = len(sealed.data)
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
            attributes=_with_canonicalisation(
                placed_attributes(crossing.attributes, crossing.place, sequence), canonical
            ),
        )
        envelope = unchained.linked(cursor.chain_head)
        status = (
            crossing.attributes.get("status") if crossing.event_type == "run.finished" else None
        )
        encoded = self._codec.encode(envelope)
        if (labels := len(encoded) - len(payload or b"")) > MAX_ENVELOPE_BYTES:
            raise _too_large(envelope, labels)
        return PreparedEvent(envelope, encoded, blob, status)

    def _packed(
        self, crossing: Crossing, context: PayloadContext, canonical: Canonicalisation
    ) -> tuple[Crossing, Sealed]:
        """The sealed body of ``crossing``, or of its truncated form when the whole body
        is over the ceiling."""
        sealed = self._pipeline.pack(crossing.event_type, crossing.version, crossing.body, context)
        ceiling = self._settings.max_blob_bytes
        if len(sealed.data) <= ceiling:
            return crossing, sealed
        truncate = _TRUNCATE.get(crossing.event_type)
        if truncate is None:
            raise PayloadTooLarge(crossing.event_type, len(sealed.data), ceiling)
        crossing = truncate(
            crossing, body_bytes=len(sealed.data), ceiling=ceiling, canonical=canonical
        )
        sealed = self._pipeline.pack(crossing.event_type, crossing.version, crossing.body, context)
        if len(sealed.data) > ceiling:
            raise PayloadTooLarge(crossing.event_type, len(sealed.data), ceiling)
        return crossing, sealed


def new_credential() -> bytes:
    """A fresh writer credential for a run."""
    return os.urandom(CREDENTIAL_BYTES)


def _too_large(envelope: Envelope, size: int) -> NotSerialisable:
    """The refusal of an event whose envelope is over :data:`MAX_ENVELOPE_BYTES`, naming
    its longest label (a state's, a tool's, a model's name; an id)."""
    labels = {**envelope.attributes, "agent_id": envelope.agent_id, "run_id": envelope.run_id}
    labels.update((f"subject_ids[{i}]", s) for i, s in enumerate(envelope.subject_ids))
    name, value = max(labels.items(), key=lambda item: len(item[1]))
    return NotSerialisable(
        f"{envelope.event_type}.{name}",
        f"the event's ids, names and attributes would take {size:,} bytes, over the "
        f"{MAX_ENVELOPE_BYTES:,} they may (this label alone is {len(value):,} characters)",
        "Names and ids are labels: put long text in the call's arguments, result or state, "
        "which are stored as the event's body.",
    )


CREDENTIAL_BYTES = 32


class _RandomPool(threading.local):
    """Random bytes for event ids, drawn from the OS 4 KiB at a time, one pool a thread.

    One ``os.urandom`` call per event was more than its cost in CPU: the call lets go of
    the GIL, and an agent thread that lets go of it and takes it back every few hundred
    microseconds starves the process's other threads (group commit's writer thread
    started its batches tens of milliseconds late). A forked child draws afresh, so that
    parent and child never hand out the same ids.
    """

    def __init__(self) -> None:
        self.data = b""
        self.at = 0
        self.generation = -1


_POOL = _RandomPool()
_POOL_BYTES = 4096
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


def new_event_id() -> str:
    """A fresh, globally unique event id: a random (version 4) UUID in canonical form,
    from 16 bytes of the thread's pool."""
    pool = _POOL
    at = pool.at
    if at >= len(pool.data) or pool.generation != _generation:
        pool.data, at, pool.generation = os.urandom(_POOL_BYTES), 0, _generation
    pool.at = at + 16
    return str(uuid.UUID(bytes=pool.data[at : at + 16], version=4))


def _with_canonicalisation(
    attributes: dict[str, str], canonical: Canonicalisation
) -> dict[str, str]:
    """``attributes`` naming ``canonical`` (the same dict for version 1, which envelopes
    name by saying nothing)."""
    named = canonical.attributes
    return {**attributes, **named} if named else attributes
