"""The envelope's own Avro record read straight into an :class:`Envelope`.

Every consumer, the relay's checks and every replay decode one envelope per event, and
fastavro's generic reader (a dispatch on the schema's types for each of the 22 fields,
a record dict, then :meth:`Envelope.from_record`) was the largest single cost of the
views consumer: 12 to 20 us of its 40 to 50 us an event. The envelope's layout is fixed
by its schema, so here it is read field by field in that order, into the envelope's
slots, at about half the cost.

The reader is used only for the schema it was written for: :func:`reader_for` compares
the codec's parsed schema with :data:`LAYOUT` and gives no reader for any other. It
reads only what it is sure of; anything else (a union branch the schema lacks, a
length past the end, bytes that are not UTF-8, a varint over 9 bytes, an int out of
its range, a time out of datetime's, a UUID not in
canonical form, trailing bytes) makes it return None, and the codec decodes that
message with fastavro as before, which raises the same errors it always did. Unit
tests hold the two paths equal on the template's events and on random envelopes.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from agent_blackbox.schemas._envelope import Envelope, _Unfrozen

LAYOUT = (
    ("event_id", "uuid"),
    ("run_id", "string"),
    ("sequence", "long"),
    ("event_type", "string"),
    ("body_version", "int"),
    ("recorded_at", "timestamp-micros"),
    ("tenant_id", "string"),
    ("agent_id", "string"),
    ("subject_ids", "array<string>"),
    ("trace_id", "null|string"),
    ("span_id", "null|string"),
    ("parent_span_id", "null|string"),
    ("input_digest", "string"),
    ("output_digest", "string"),
    ("chain_hash", "string"),
    ("payload", "null|bytes"),
    ("payload_ref", "null|string"),
    ("payload_encoding", "string"),
    ("key_id", "null|string"),
    ("classification", "string"),
    ("retention_class", "string"),
    ("attributes", "map<string>"),
)
"""The fields of the envelope record this reader reads, in order, with their types."""

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


class _Unsure(Exception):
    """Something this reader leaves to fastavro."""


def reader_for(parsed: Any) -> Any:
    """:func:`read_envelope` when ``parsed`` (a parsed Avro schema) is the record of
    :data:`LAYOUT`, else None."""
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    fields = parsed.get("fields", [])
    layout = tuple((field.get("name"), _kind(field.get("type"))) for field in fields)
    return read_envelope if layout == LAYOUT else None


def _kind(schema: Any) -> str | None:
    """The :data:`LAYOUT` name of a field's type, or None for any other."""
    if isinstance(schema, str):
        return schema if schema in ("string", "long", "int") else None
    if isinstance(schema, list):
        if len(schema) == 2 and schema[0] == "null" and schema[1] in ("string", "bytes"):
            return f"null|{schema[1]}"
        return None
    if not isinstance(schema, dict):
        return None
    kind, logical = schema.get("type"), schema.get("logicalType")
    if kind == "string" and logical == "uuid":
        return "uuid"
    if kind == "long" and logical == "timestamp-micros":
        return "timestamp-micros"
    if logical is None and kind == "array" and schema.get("items") == "string":
        return "array<string>"
    if logical is None and kind == "map" and schema.get("values") == "string":
        return "map<string>"
    return None


def read_envelope(data: bytes, start: int) -> Envelope | None:
    """The envelope whose Avro record begins at ``start`` of ``data`` and ends with it;
    None when this reader is not sure of it (see the module's docstring)."""
    try:
        return _read(data, start)
    except (_Unsure, IndexError, UnicodeDecodeError, OverflowError):
        return None


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` and the position after it."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos + 1
        shift += 7
        if shift > 56:  # a tenth byte: fastavro's 64-bit arithmetic decides
            raise _Unsure


def _text(data: bytes, pos: int) -> tuple[str, int]:
    """The string at ``pos`` and the position after it."""
    size = data[pos]
    if size < 0x80:  # a length under 64: one byte, the most common case
        start = pos + 1
    elif data[pos + 1] < 0x80:  # under 8,192: two bytes (digests and chain hashes)
        size, start = (size & 0x7F) | (data[pos + 1] << 7), pos + 2
    else:
        size, start = _long(data, pos)
        if size < 0:
            raise _Unsure
        size <<= 1  # as the two forms above leave it: twice the length
    end = start + (size >> 1)
    if size & 1 or end > len(data):  # odd: a negative length (zigzag)
        raise _Unsure
    return data[start:end].decode(), end


def _optional(data: bytes, pos: int) -> tuple[str | None, int]:
    """A ``["null", "string"]`` union at ``pos``."""
    branch = data[pos]
    if branch == 0:
        return None, pos + 1
    if branch != 2:  # the zigzag varint of 1: the string branch
        raise _Unsure
    return _text(data, pos + 1)


def _strings(data: bytes, pos: int, *, pairs: bool) -> tuple[list[str], int]:
    """An array of strings (or, ``pairs``, a map's keys and values in turn) at ``pos``:
    blocks of a count (negative: followed by the block's size in bytes) until a 0."""
    items: list[str] = []
    while True:
        count, pos = _long(data, pos)
        if count == 0:
            return items, pos
        if count < 0:
            count = -count
            _, pos = _long(data, pos)
        for _ in range(count * 2 if pairs else count):
            item, pos = _text(data, pos)
            items.append(item)


def _read(data: bytes, pos: int) -> Envelope:
    event_id, pos = _text(data, pos)
    if _CANONICAL_UUID.fullmatch(event_id) is None:
        raise _Unsure  # fastavro's UUID and its string form decide
    envelope: Any = _Unfrozen()
    envelope.event_id = event_id
    envelope.run_id, pos = _text(data, pos)
    envelope.sequence, pos = _long(data, pos)
    envelope.event_type, pos = _text(data, pos)
    envelope.body_version, pos = _long(data, pos)
    if not _INT_MIN <= envelope.body_version <= _INT_MAX:
        raise _Unsure  # an Avro int out of its range: fastavro's reading decides
    micros, pos = _long(data, pos)
    envelope.recorded_at = _EPOCH + _MICROSECOND * micros
    envelope.tenant_id, pos = _text(data, pos)
    envelope.agent_id, pos = _text(data, pos)
    subjects, pos = _strings(data, pos, pairs=False)
    envelope.subject_ids = tuple(subjects)
    envelope.trace_id, pos = _optional(data, pos)
    envelope.span_id, pos = _optional(data, pos)
    envelope.parent_span_id, pos = _optional(data, pos)
    envelope.input_digest, pos = _text(data, pos)
    envelope.output_digest, pos = _text(data, pos)
    envelope.chain_hash, pos = _text(data, pos)
    pos = _payload(envelope, data, pos)
    envelope.payload_ref, pos = _optional(data, pos)
    envelope.payload_encoding, pos = _text(data, pos)
    envelope.key_id, pos = _optional(data, pos)
    envelope.classification, pos = _text(data, pos)
    envelope.retention_class, pos = _text(data, pos)
    pairs, pos = _strings(data, pos, pairs=True)
    envelope.attributes = dict(zip(pairs[::2], pairs[1::2], strict=True))
    if pos != len(data):
        raise _Unsure  # trailing bytes: fastavro's path names them
    envelope.__class__ = Envelope
    return cast(Envelope, envelope)


def _payload(envelope: Any, data: bytes, pos: int) -> int:
    """Read the ``["null", "bytes"]`` payload at ``pos`` into ``envelope``."""
    branch = data[pos]
    if branch == 0:
        envelope.payload = None
        return pos + 1
    if branch != 2:
        raise _Unsure
    size, pos = _long(data, pos + 1)
    end = pos + size
    if size < 0 or end > len(data):
        raise _Unsure
    envelope.payload = data[pos:end]
    return end
