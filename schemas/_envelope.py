"""The event envelope and its hash chain."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring as _q  # how json writes a str (not ASCII-only)
from typing import Any

from schemas._canonical import canonical_json, digest_bytes

GENESIS_CHAIN_HASH = "0" * 64
"""The chain hash a run starts from, before its first event."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One recorded boundary event, the same record for every event type.

    ``payload`` holds the body as produced by the payload pipeline (Avro, maybe
    sealed); ``payload_ref`` names a body stored out of line instead. ``attributes``
    are unsealed, non-sensitive metadata for indexing and never carry bodies.
    """

    event_id: str
    run_id: str
    sequence: int
    event_type: str
    body_version: int
    recorded_at: datetime
    tenant_id: str
    agent_id: str
    input_digest: str
    output_digest: str
    chain_hash: str
    subject_ids: tuple[str, ...] = ()
    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None
    payload: bytes | None = None
    payload_ref: str | None = None
    payload_encoding: str = "avro"
    key_id: str | None = None
    classification: str = "internal"
    retention_class: str = "standard"
    attributes: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """The envelope as the Avro record fastavro writes."""
        return {
            "event_id": self.event_id,
            "run_id": self.run_id,
            "sequence": self.sequence,
            "event_type": self.event_type,
            "body_version": self.body_version,
            "recorded_at": self.recorded_at,
            "tenant_id": self.tenant_id,
            "agent_id": self.agent_id,
            "subject_ids": list(self.subject_ids),
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "input_digest": self.input_digest,
            "output_digest": self.output_digest,
            "chain_hash": self.chain_hash,
            "payload": self.payload,
            "payload_ref": self.payload_ref,
            "payload_encoding": self.payload_encoding,
            "key_id": self.key_id,
            "classification": self.classification,
            "retention_class": self.retention_class,
            "attributes": self.attributes,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Envelope:
        """Build an envelope from a record fastavro read: with the envelope schema's
        logical types (a UUID and a datetime) or without them (their string and
        microseconds, as archives store them)."""
        at = record["recorded_at"]
        if type(at) is int:
            at = _EPOCH + timedelta(microseconds=at)
        elif at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        subjects = record["subject_ids"]
        attributes = record["attributes"]
        # Replay builds one envelope per event: set the slots directly, in field order,
        # instead of through the frozen __init__ (a third of the cost; no check is lost,
        # the generated __init__ has none). The round-trip tests hold the order.
        return _assemble(
            str(record["event_id"]),
            record["run_id"],
            record["sequence"],
            record["event_type"],
            record["body_version"],
            at,
            record["tenant_id"],
            record["agent_id"],
            record["input_digest"],
            record["output_digest"],
            record["chain_hash"],
            tuple(subjects) if subjects else (),
            record["trace_id"],
            record["span_id"],
            record["parent_span_id"],
            record["payload"],
            record["payload_ref"],
            record["payload_encoding"],
            record["key_id"],
            record["classification"],
            record["retention_class"],
            dict(attributes) if attributes else {},
        )

    @property
    def recorded_at_us(self) -> int:
        """``recorded_at`` in microseconds since the Unix epoch, as the chain hashes it."""
        return _micros(self.recorded_at)

    def chain_material(self) -> bytes:
        """Canonical JSON of this envelope without ``chain_hash``: what the chain hashes.

        The payload enters by its SHA-256, so the chain covers the bytes without
        carrying them twice.
        """
        if type(self.sequence) is int and type(self.body_version) is int:
            try:
                return self._chain_json().encode("utf-8")
            except TypeError:  # a field off its annotated type; canonical_json names it
                pass
        return canonical_json(self.chain_record())

    def chain_record(self) -> dict[str, Any]:
        """The record :meth:`chain_material` is the canonical JSON of."""
        record = self.to_record()
        del record["chain_hash"]
        record["recorded_at"] = _micros(self.recorded_at)
        record["payload"] = None if self.payload is None else digest_bytes(self.payload)
        return record

    def _chain_json(self) -> str:
        """``canonical_json(self.chain_record())`` written out, three times faster: replay
        checks the chain of every event. Keys in sorted order, strings escaped as ``json``
        escapes them; a unit test holds the two equal. Raises TypeError where a string
        field holds something else."""
        attributes = ",".join([f"{_q(k)}:{_q(v)}" for k, v in sorted(self.attributes.items())])
        payload = "null" if self.payload is None else _q(digest_bytes(self.payload))
        # The five optional strings, inlined: a helper call each costs more than _q.
        key_id = "null" if self.key_id is None else _q(self.key_id)
        parent = "null" if self.parent_span_id is None else _q(self.parent_span_id)
        ref = "null" if self.payload_ref is None else _q(self.payload_ref)
        span = "null" if self.span_id is None else _q(self.span_id)
        trace = "null" if self.trace_id is None else _q(self.trace_id)
        return (
            f'{{"agent_id":{_q(self.agent_id)},"attributes":{{{attributes}}},'
            f'"body_version":{self.body_version},"classification":{_q(self.classification)},'
            f'"event_id":{_q(self.event_id)},"event_type":{_q(self.event_type)},'
            f'"input_digest":{_q(self.input_digest)},"key_id":{key_id},'
            f'"output_digest":{_q(self.output_digest)},'
            f'"parent_span_id":{parent},"payload":{payload},'
            f'"payload_encoding":{_q(self.payload_encoding)},'
            f'"payload_ref":{ref},"recorded_at":{_micros(self.recorded_at)},'
            f'"retention_class":{_q(self.retention_class)},"run_id":{_q(self.run_id)},'
            f'"sequence":{self.sequence},"span_id":{span},'
            f'"subject_ids":[{",".join(map(_q, self.subject_ids))}],'
            f'"tenant_id":{_q(self.tenant_id)},"trace_id":{trace}}}'
        )

    def expected_chain_hash(self, previous: str) -> str:
        """The chain hash this envelope must carry, given the previous event's."""
        return next_chain_hash(previous, self.chain_material())


_SLOTS = tuple(Envelope.__dict__[f.name] for f in fields(Envelope))


def _assemble(*values: Any) -> Envelope:
    envelope: Envelope = object.__new__(Envelope)
    for slot, value in zip(_SLOTS, values, strict=True):
        slot.__set__(envelope, value)
    return envelope


def next_chain_hash(previous: str, material: bytes) -> str:
    """SHA-256(previous chain hash ‖ material), as hex."""
    return hashlib.sha256(bytes.fromhex(previous) + material).hexdigest()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND
