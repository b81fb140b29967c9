"""The envelope's Avro body written straight from its fields, for the recorder.

The recorder encodes every event it records, and in group commit mode that encoding is
what an agent's thread waits for: fastavro takes about 18 us an envelope (most of it
resolving the six optional fields' unions against their values), this about a third of
that. It writes the one envelope schema it knows, field by field, exactly as fastavro
writes it: strings and bytes as a zig-zag length and their bytes, ``long`` and ``int`` as
zig-zag varints, a union as its branch and value, an array or map as one block and the
closing zero, ``recorded_at`` as the microseconds of an aware datetime. Anything else (a
naive datetime, a value of another type, a number out of range, another schema) is left
to fastavro, which writes it or raises as it always did. Unit tests hold the bytes of
both equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_blackbox.schemas._envelope import Envelope

Fields = tuple[tuple[str, Any], ...]

EXPECTED: Fields = (
    ("event_id", {"type": "string", "logicalType": "uuid"}),
    ("run_id", "string"),
    ("sequence", "long"),
    ("event_type", "string"),
    ("body_version", "int"),
    ("recorded_at", {"type": "long", "logicalType": "timestamp-micros"}),
    ("tenant_id", "string"),
    ("agent_id", "string"),
    ("subject_ids", {"type": "array", "items": "string"}),
    ("trace_id", ["null", "string"]),
    ("span_id", ["null", "string"]),
    ("parent_span_id", ["null", "string"]),
    ("input_digest", "string"),
    ("output_digest", "string"),
    ("chain_hash", "string"),
    ("payload", ["null", "bytes"]),
    ("payload_ref", ["null", "string"]),
    ("payload_encoding", "string"),
    ("key_id", ["null", "string"]),
    ("classification", "string"),
    ("retention_class", "string"),
    ("attributes", {"type": "map", "values": "string"}),
)
"""The fields (names and types, in order) of the schema this writer writes."""

_LONG = 1 << 63
_INT = 1 << 31
_SMALL = [bytes([(n << 1) ^ (n >> 63)]) for n in range(-64, 64)]
"""The varints of -64..63: one byte each (lengths, counts, branches, versions)."""
_NULL = b"\x00"
_SOME = b"\x02"
"""The branch of a ``["null", X]`` union's value."""


def _varint(n: int) -> bytes:
    """``n`` as Avro writes a long: zig-zag, then 7 bits a byte, low bits first."""
    if -64 <= n < 64:
        return _SMALL[n + 64]
    if not -_LONG <= n < _LONG:
        raise OverflowError(f"{n} is out of the range of an Avro long")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def envelope_writer(fields: Fields) -> Callable[[Envelope], bytes] | None:
    """The straight writer of envelopes for a schema of ``fields`` (names and types as
    the schema file gives them), or None when it is not the schema this writer knows."""
    return write_envelope if fields == EXPECTED else None


_KNOWN: dict[str, bytes] = {}
"""Written strings of the fields that repeat from event to event (run, tenant, agent,
event type, classes, attribute names...), by value; bounded by :data:`_KNOWN_MAX`."""
_KNOWN_MAX = 4096


def _known(value: str) -> bytes:
    """``value`` written as an Avro string (its length, its UTF-8), remembered."""
    written = _KNOWN.get(value)
    if written is None:
        data = value.encode("utf-8")
        written = _varint(len(data)) + data
        if len(_KNOWN) < _KNOWN_MAX:
            _KNOWN[value] = written
    return written


def _text(value: str) -> bytes:
    """``value`` written as an Avro string."""
    data = value.encode("utf-8")
    return _varint(len(data)) + data


def _optional(value: str | None) -> bytes:
    """``value`` written as a ``["null", "string"]`` union."""
    return _NULL if value is None else _SOME + _text(value)


def write_envelope(envelope: Envelope) -> bytes:
    """The Avro body of ``envelope``, as fastavro writes it.

    Raises:
        TypeError, AttributeError, ValueError, OverflowError: a field holds something
            this writer does not write (the caller then asks fastavro).
    """
    at = envelope.recorded_at
    if at.tzinfo is None:
        raise ValueError("a naive recorded_at is written by fastavro")
    version = envelope.body_version
    if not -_INT <= version < _INT:
        raise OverflowError(f"body_version {version} is out of the range of an Avro int")
    payload = envelope.payload
    if payload is None:
        body = _NULL
    elif type(payload) is bytes:
        body = _SOME + _varint(len(payload)) + payload
    else:
        raise TypeError("a payload that is not bytes is written by fastavro")
    parts = [
        _text(envelope.event_id),
        _known(envelope.run_id),
        _varint(envelope.sequence),
        _known(envelope.event_type),
        _varint(version),
        _varint(envelope.recorded_at_us),
        _known(envelope.tenant_id),
        _known(envelope.agent_id),
    ]
    subjects = envelope.subject_ids
    if subjects:
        parts.append(_varint(len(subjects)))
        parts += [_known(subject) for subject in subjects]
    parts += (
        _NULL,
        _optional(envelope.trace_id),
        _optional(envelope.span_id),
        _optional(envelope.parent_span_id),
        _text(envelope.input_digest),
        _text(envelope.output_digest),
        _text(envelope.chain_hash),
        body,
        _optional(envelope.payload_ref),
        _known(envelope.payload_encoding),
        _NULL if envelope.key_id is None else _SOME + _known(envelope.key_id),
        _known(envelope.classification),
        _known(envelope.retention_class),
    )
    attributes = envelope.attributes
    if attributes:
        parts.append(_varint(len(attributes)))
        for name, value in attributes.items():
            parts += (_known(name), _text(value))
    parts.append(_NULL)
    return b"".join(parts)
