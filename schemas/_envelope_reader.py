"""A reader of the envelope's Avro body written for its one schema, for the hot path.

fastavro walks a parsed schema for every record; for the envelope, whose schema is
fixed, that walk costs most of a consumer's decode. This module reads the same bytes
straight, field by field, and gives up on anything off the common path (a malformed
varint, a length past the end, an unknown union branch, a negative block count, bad
UTF-8, an event id not in canonical UUID form, a timestamp out of range, trailing
bytes): the codec then decodes the message with fastavro as before, which either
reads it the same way or names what is wrong. So the fast path accepts only what
fastavro accepts and yields the same envelope; a unit test holds both.
"""

from __future__ import annotations

import re
from typing import Any

from agent_blackbox.schemas._envelope import Envelope

LAYOUT: tuple[tuple[str, Any], ...] = (
    ("event_id", {"logicalType": "uuid", "type": "string"}),
    ("run_id", "string"),
    ("sequence", "long"),
    ("event_type", "string"),
    ("body_version", "int"),
    ("recorded_at", {"logicalType": "timestamp-micros", "type": "long"}),
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
"""The fields (as fastavro parses them) this reader is written for, in order."""

_CANONICAL_UUID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
).fullmatch
"""The form ``str(uuid.UUID(x))`` gives: any other spelling goes through fastavro."""

_INT32 = range(-(2**31), 2**31)


class _OffPath(Exception):
    """The bytes leave the common path; fastavro decides."""


def fits(parsed_schema: Any) -> bool:
    """Whether ``parsed_schema`` (as fastavro parsed it) is the one this reader reads."""
    fields = parsed_schema.get("fields") if isinstance(parsed_schema, dict) else None
    return (
        isinstance(fields, list) and tuple((f.get("name"), f.get("type")) for f in fields) == LAYOUT
    )


def read_envelope(data: bytes, start: int) -> Envelope | None:
    """The envelope whose Avro body starts at ``start`` and ends with ``data``, or
    ``None`` when the bytes are off the common path (see the module)."""
    try:
        return _read(data, start)
    except (_OffPath, IndexError, UnicodeDecodeError, OverflowError):
        return None


def _read(buf: bytes, pos: int) -> Envelope:
    event_id, pos = _text(buf, pos)
    if not _CANONICAL_UUID(event_id):
        raise _OffPath
    run_id, pos = _text(buf, pos)
    sequence, pos = _long(buf, pos)
    event_type, pos = _text(buf, pos)
    body_version, pos = _long(buf, pos)
    if body_version not in _INT32:
        raise _OffPath
    recorded_at, pos = _long(buf, pos)
    tenant_id, pos = _text(buf, pos)
    agent_id, pos = _text(buf, pos)
    subject_ids, pos = _strings(buf, pos)
    trace_id, pos = _optional_text(buf, pos)
    span_id, pos = _optional_text(buf, pos)
    parent_span_id, pos = _optional_text(buf, pos)
    input_digest, pos = _text(buf, pos)
    output_digest, pos = _text(buf, pos)
    chain_hash, pos = _text(buf, pos)
    payload, pos = _optional_bytes(buf, pos)
    payload_ref, pos = _optional_text(buf, pos)
    payload_encoding, pos = _text(buf, pos)
    key_id, pos = _optional_text(buf, pos)
    classification, pos = _text(buf, pos)
    retention_class, pos = _text(buf, pos)
    attributes, pos = _map(buf, pos)
    if pos != len(buf):
        raise _OffPath
    return Envelope.from_record(
        {
            "event_id": event_id,
            "run_id": run_id,
            "sequence": sequence,
            "event_type": event_type,
            "body_version": body_version,
            "recorded_at": recorded_at,  # microseconds: from_record makes the datetime
            "tenant_id": tenant_id,
            "agent_id": agent_id,
            "subject_ids": subject_ids,
            "trace_id": trace_id,
            "span_id": span_id,
            "parent_span_id": parent_span_id,
            "input_digest": input_digest,
            "output_digest": output_digest,
            "chain_hash": chain_hash,
            "payload": payload,
            "payload_ref": payload_ref,
            "payload_encoding": payload_encoding,
            "key_id": key_id,
            "classification": classification,
            "retention_class": retention_class,
            "attributes": attributes,
        }
    )


def _long(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint; at most nine bytes (63 bits), where fastavro's 64-bit reading
    and Python's integers agree."""
    byte = buf[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    value = byte & 0x7F
    shift = 7
    while True:
        pos += 1
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos + 1
        shift += 7
        if shift > 56:
            raise _OffPath


def _bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    byte = buf[pos]
    if byte < 0x80:
        size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
    else:
        size, pos = _long(buf, pos)
    end = pos + size
    if size < 0 or end > len(buf):
        raise _OffPath
    return buf[pos:end], end


def _text(buf: bytes, pos: int) -> tuple[str, int]:
    # _bytes, unrolled: most of an envelope is short strings, and a call is a third
    # of the cost of reading one.
    byte = buf[pos]
    if byte < 0x80:
        size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
    else:
        size, pos = _long(buf, pos)
    end = pos + size
    if size < 0 or end > len(buf):
        raise _OffPath
    return buf[pos:end].decode(), end


def _optional_text(buf: bytes, pos: int) -> tuple[str | None, int]:
    branch = buf[pos]
    if branch == 0:
        return None, pos + 1
    if branch == 2:
        return _text(buf, pos + 1)
    raise _OffPath


def _optional_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    branch = buf[pos]
    if branch == 0:
        return None, pos + 1
    if branch == 2:
        return _bytes(buf, pos + 1)
    raise _OffPath


def _strings(buf: bytes, pos: int) -> tuple[list[str], int]:
    items: list[str] = []
    while True:
        count, pos = _long(buf, pos)
        if count == 0:
            return items, pos
        if count < 0:
            raise _OffPath
        for _ in range(count):
            item, pos = _text(buf, pos)
            items.append(item)


def _map(buf: bytes, pos: int) -> tuple[dict[str, str], int]:
    entries: dict[str, str] = {}
    while True:
        count, pos = _long(buf, pos)
        if count == 0:
            return entries, pos
        if count < 0:
            raise _OffPath
        for _ in range(count):
            key, pos = _text(buf, pos)
            entries[key], pos = _text(buf, pos)
