"""The event envelope and its hash chain."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring as _q  # how json writes a str (not ASCII-only)
from typing import Any, cast

from agent_blackbox.schemas._canonical import DIGEST_PREFIX, digest_bytes
from agent_blackbox.schemas._digests import Canonicalisation, canonicalisation_of
from agent_blackbox.schemas._jcs import utf16_key

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
            at = _EPOCH + _MICROSECOND * at
        elif at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        subjects = record["subject_ids"]
        attributes = record["attributes"]
        # Every consumer and replay build one envelope per event. The frozen __init__
        # sets each field through object.__setattr__ by name; here the fields are set
        # on a mutable twin with the same slots (plain attribute stores, the cheapest
        # the interpreter has), which then becomes an Envelope. No check is lost: the
        # generated __init__ has none. A unit test holds that every field is set.
        envelope: Any = _Unfrozen()
        envelope.event_id = str(record["event_id"])
        envelope.run_id = record["run_id"]
        envelope.sequence = record["sequence"]
        envelope.event_type = record["event_type"]
        envelope.body_version = record["body_version"]
        envelope.recorded_at = at
        envelope.tenant_id = record["tenant_id"]
        envelope.agent_id = record["agent_id"]
        envelope.input_digest = record["input_digest"]
        envelope.output_digest = record["output_digest"]
        envelope.chain_hash = record["chain_hash"]
        envelope.subject_ids = tuple(subjects) if subjects else ()
        envelope.trace_id = record["trace_id"]
        envelope.span_id = record["span_id"]
        envelope.parent_span_id = record["parent_span_id"]
        envelope.payload = record["payload"]
        envelope.payload_ref = record["payload_ref"]
        envelope.payload_encoding = record["payload_encoding"]
        envelope.key_id = record["key_id"]
        envelope.classification = record["classification"]
        envelope.retention_class = record["retention_class"]
        envelope.attributes = dict(attributes) if attributes else {}
        envelope.__class__ = cls
        return cast(Envelope, envelope)

    @property
    def recorded_at_us(self) -> int:
        """``recorded_at`` in microseconds since the Unix epoch, as the chain hashes it."""
        return _micros(self.recorded_at)

    @property
    def canonicalisation(self) -> Canonicalisation:
        """How this envelope's digests and chain material were written: named by its
        ``c14n`` attribute (absent: version 1).

        Raises:
            UnknownCanonicalisation: it names one this release does not know.
        """
        return canonicalisation_of(self.attributes)

    def chain_material(self) -> bytes:
        """Canonical JSON of this envelope without ``chain_hash``, under the envelope's
        canonicalisation: what the chain hashes.

        The payload enters by its SHA-256, so the chain covers the bytes without
        carrying them twice.

        Raises:
            UnknownCanonicalisation: the envelope names a canonicalisation this release
                does not know.
        """
        canonical = canonicalisation_of(self.attributes)
        if (
            type(self.sequence) is int
            and type(self.body_version) is int
            # Numbers both forms write as their digits: under 2**53 (a recorded time
            # in microseconds stays under it until the year 2255).
            and (canonical.code_point_keys or _plain_numbers(self))
        ):
            try:
                return self._chain_json(canonical.code_point_keys).encode("utf-8")
            except TypeError:  # a field off its annotated type; the encoder names it
                pass
        return canonical.json(self.chain_record())

    def chain_record(self) -> dict[str, Any]:
        """The record :meth:`chain_material` is the canonical JSON of."""
        record = self.to_record()
        del record["chain_hash"]
        record["recorded_at"] = _micros(self.recorded_at)
        record["payload"] = None if self.payload is None else digest_bytes(self.payload)
        return record

    def _chain_json(self, code_point_keys: bool) -> str:
        """``canonicalisation.json(self.chain_record())`` written out, a third of its
        cost: replay checks the chain of every event. Keys in sorted order (the
        attributes' by code point, or by UTF-16 code units when not
        ``code_point_keys``), strings as ``json`` writes them (as JCS does); unit tests
        hold the two equal. Raises TypeError where a string field holds something
        else."""
        attributes, subjects = self.attributes, self.subject_ids
        key_id, parent, ref = self.key_id, self.parent_span_id, self.payload_ref
        span, trace = self.span_id, self.trace_id
        # Every string field of the envelope in one (join raises TypeError on anything
        # else). When its UTF-8 holds only bytes JSON writes as they are, no string needs
        # escaping: each goes between quotes as it is, at a third of the cost of quoting
        # each. The attributes are looked at apart: one that needs escaping (a JSON text
        # in an attribute) is quoted alone, and the fields still go in as they are.
        texts = "".join(
            (
                self.agent_id,
                self.classification,
                self.event_id,
                self.event_type,
                self.input_digest,
                self.output_digest,
                self.payload_encoding,
                self.retention_class,
                self.run_id,
                self.tenant_id,
                "" if key_id is None else key_id,
                "" if parent is None else parent,
                "" if ref is None else ref,
                "" if span is None else span,
                "" if trace is None else trace,
                *subjects,
            )
        )
        named = "".join((*attributes, *attributes.values()))
        if len(attributes) > 1 and not code_point_keys and not "".join(attributes).isascii():
            ordered = sorted(attributes.items(), key=lambda pair: utf16_key(pair[0]))
        else:
            ordered = sorted(attributes.items())
        if not named.encode("utf-8").translate(None, _VERBATIM):
            if len(attributes) == 1:
                [(name, value)] = attributes.items()
                pairs = f'"{name}":"{value}"'
            else:
                pairs = ",".join([f'"{k}":"{v}"' for k, v in ordered])
        else:
            # Sorted by the keys as they are, as canonical JSON sorts them, then escaped.
            pairs = ",".join([f"{_q(k)}:{_q(v)}" for k, v in ordered])
        if not texts.encode("utf-8").translate(None, _VERBATIM):
            return self._written_chain_json(pairs)
        return _escaped(self)._written_chain_json(pairs)

    def _written_chain_json(self, pairs: str) -> str:
        """The chain material with the attributes' JSON ``pairs``, each other string put
        between quotes as it is."""
        subjects = self.subject_ids
        key_id, parent, ref = self.key_id, self.parent_span_id, self.payload_ref
        span, trace = self.span_id, self.trace_id
        names = '"' + '","'.join(subjects) + '"' if subjects else ""
        # The payload's digest is ours, hex: it needs no escaping.
        payload = self.payload
        digest = "null" if payload is None else f'"{DIGEST_PREFIX}{_sha256(payload).hexdigest()}"'
        key_id = "null" if key_id is None else f'"{key_id}"'
        parent = "null" if parent is None else f'"{parent}"'
        ref = "null" if ref is None else f'"{ref}"'
        span = "null" if span is None else f'"{span}"'
        trace = "null" if trace is None else f'"{trace}"'
        return (
            f'{{"agent_id":"{self.agent_id}","attributes":{{{pairs}}},'
            f'"body_version":{self.body_version},"classification":"{self.classification}",'
            f'"event_id":"{self.event_id}","event_type":"{self.event_type}",'
            f'"input_digest":"{self.input_digest}","key_id":{key_id},'
            f'"output_digest":"{self.output_digest}","parent_span_id":{parent},'
            f'"payload":{digest},"payload_encoding":"{self.payload_encoding}",'
            f'"payload_ref":{ref},"recorded_at":{(self.recorded_at - _EPOCH) // _MICROSECOND},'
            f'"retention_class":"{self.retention_class}","run_id":"{self.run_id}",'
            f'"sequence":{self.sequence},"span_id":{span},"subject_ids":[{names}],'
            f'"tenant_id":"{self.tenant_id}","trace_id":{trace}}}'
        )

    def expected_chain_hash(self, previous: str) -> str:
        """The chain hash this envelope must carry, given the previous event's."""
        return _sha256(_fromhex(previous) + self.chain_material()).hexdigest()

    def linked(self, previous: str) -> Envelope:
        """This envelope, with the chain hash it must carry after ``previous`` written in.

        Only for an envelope just built with an empty ``chain_hash`` that nothing else
        holds yet (the writer's): it is completed in place rather than copied, 22 fields
        a copy that cost the recorder 4% of an event.

        Raises:
            ValueError: the envelope has a chain hash already.
        """
        if self.chain_hash:
            raise ValueError("linked() completes an envelope built without a chain hash")
        object.__setattr__(self, "chain_hash", self.expected_chain_hash(previous))
        return self


_VERBATIM = bytes(sorted(set(range(256)) - {ord('"'), ord("\\")} - set(range(0x20))))
"""The bytes of UTF-8 that canonical JSON writes as they are: all but the quote, the
backslash and the control characters (it writes non-ASCII unescaped)."""


def _escaped(envelope: Envelope) -> Envelope:
    """``envelope`` with each string field as JSON escapes it, without its quotes (the
    attributes are left as they are)."""
    changes: dict[str, Any] = {
        f.name: _q(value)[1:-1]
        for f in fields(Envelope)
        if type(value := getattr(envelope, f.name)) is str
    }
    changes["subject_ids"] = tuple(_q(s)[1:-1] for s in envelope.subject_ids)
    return replace(envelope, **changes)


def _plain_numbers(envelope: Envelope) -> bool:
    """Whether the numbers of ``envelope``'s chain material lie where RFC 8785 writes
    them as their digits (within 2**53)."""
    return (
        abs(envelope.sequence) <= _SAFE
        and abs(envelope.body_version) <= _SAFE
        and _FIRST_SAFE_YEAR <= envelope.recorded_at.year <= _LAST_SAFE_YEAR
    )


_SAFE = 2**53
_FIRST_SAFE_YEAR, _LAST_SAFE_YEAR = 1700, 2250
"""Years whose times in microseconds since 1970 stay within 2**53 (1685 to 2255)."""


class _Unfrozen:
    """An :class:`Envelope` under construction: the same slots, settable (see
    :meth:`Envelope.from_record`)."""

    __slots__ = Envelope.__slots__


def next_chain_hash(previous: str, material: bytes) -> str:
    """SHA-256(previous chain hash ‖ material), as hex."""
    return _sha256(_fromhex(previous) + material).hexdigest()


_sha256 = hashlib.sha256
_fromhex = bytes.fromhex


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND
