"""The event envelope and its hash chain."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    def from_record(cls, record: dict[str, Any]) -> Envelope:
        """Build an envelope from a record fastavro read."""
        values = dict(record)
        values["event_id"] = str(values["event_id"])
        values["subject_ids"] = tuple(values.get("subject_ids") or ())
        values["attributes"] = dict(values.get("attributes") or {})
        recorded_at = values["recorded_at"]
        if recorded_at.tzinfo is None:
            values["recorded_at"] = recorded_at.replace(tzinfo=UTC)
        return cls(**values)

    def chain_material(self) -> bytes:
        """Canonical JSON of this envelope without ``chain_hash``: what the chain hashes.

        The payload enters by its SHA-256, so the chain covers the bytes without
        carrying them twice.
        """
        record = self.to_record()
        del record["chain_hash"]
        record["recorded_at"] = _micros(self.recorded_at)
        record["payload"] = None if self.payload is None else digest_bytes(self.payload)
        return canonical_json(record)

    def expected_chain_hash(self, previous: str) -> str:
        """The chain hash this envelope must carry, given the previous event's."""
        return next_chain_hash(previous, self.chain_material())


def next_chain_hash(previous: str, material: bytes) -> str:
    """SHA-256(previous chain hash ‖ material), as hex."""
    return hashlib.sha256(bytes.fromhex(previous) + material).hexdigest()


def _micros(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
