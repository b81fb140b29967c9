"""Avro encoding of envelopes and bodies.

Envelopes travel as Avro single-object encoding: ``C3 01``, the 8-byte CRC-64-AVRO
fingerprint of the writer schema, then the Avro body. Readers also accept the
Confluent wire format (``00`` and a 4-byte schema id) when a resolver for schema ids
is configured. Bodies inside an envelope are plain schemaless Avro: the envelope's
``event_type`` and ``body_version`` name their writer schema.
"""

from __future__ import annotations

import io
import re
import struct
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from agent_blackbox.schemas._envelope import Envelope
from agent_blackbox.schemas._envelope_reader import reader_for
from agent_blackbox.schemas._errors import BodyEncodingError, UndecodableMessage
from agent_blackbox.schemas._registry import ENVELOPE, SchemaRegistry, default_registry

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0
_HEADER = len(SINGLE_OBJECT_MAGIC) + 8


class SchemaIdResolver(Protocol):
    """Finds the writer schema of a Confluent-framed message by its registry id."""

    def writer_schema(self, schema_id: int) -> Any:
        """The parsed Avro schema registered under ``schema_id``."""
        ...


class EnvelopeCodec:
    """Encodes envelopes as single-object Avro and decodes either framing."""

    def __init__(
        self,
        registry: SchemaRegistry | None = None,
        *,
        version: int | None = None,
        schema_ids: SchemaIdResolver | None = None,
    ) -> None:
        self._registry = registry or default_registry()
        entry = (
            self._registry.get(ENVELOPE, version)
            if version is not None
            else self._registry.latest(ENVELOPE)
        )
        self._writer = entry.parsed
        self._plain = _plain_reading(entry.parsed)
        self._read_own = reader_for(entry.parsed)
        self._prefix = SINGLE_OBJECT_MAGIC + entry.fingerprint
        self._schema_ids = schema_ids

    def encode(self, envelope: Envelope) -> bytes:
        """The single-object encoding of ``envelope``."""
        out = io.BytesIO()
        out.write(self._prefix)
        schemaless_writer(out, self._writer, envelope.to_record())
        return out.getvalue()

    def decode(self, data: bytes) -> Envelope:
        """Decode an envelope written by any known envelope schema version.

        Raises:
            UndecodableMessage: saying which check failed (framing, unknown
                fingerprint or schema id, or corrupt Avro).
        """
        # The common case first: written by this codec's own schema version, which one
        # comparison of the prefix tells without a look-up in the registry.
        own = data.startswith(self._prefix)
        # Its own version, read straight into an envelope (_envelope_reader.py); a
        # message that reader is not sure of goes the general way, which judges it.
        if own and self._read_own is not None and type(data) is bytes:
            envelope: Envelope | None = self._read_own(data, _HEADER)
            if envelope is not None:
                return envelope
        writer = self._writer if own else self._writer_for(data)
        body = io.BytesIO(data)
        body.seek(_HEADER if own or data[:2] == SINGLE_OBJECT_MAGIC else 5)
        plain = self._plain if writer is self._writer else None
        try:
            if plain is not None:
                record = plain.read(body)
            else:
                # Schema resolution only when the writer is another version: resolving
                # a schema against itself costs a third of a decode and changes nothing.
                reader = None if writer is self._writer else self._writer
                record = schemaless_reader(body, writer, reader)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise UndecodableMessage(f"envelope body is not valid Avro: {exc!r}") from exc
        if body.tell() != len(data):
            raise UndecodableMessage(
                f"envelope has {len(data) - body.tell()} trailing bytes after the Avro record"
            )
        if not isinstance(record, dict):
            raise UndecodableMessage("envelope is not an Avro record")
        try:
            return Envelope.from_record(record)
        except (KeyError, TypeError, ValueError) as exc:
            raise UndecodableMessage(f"envelope record is incomplete: {exc!r}") from exc

    def _writer_for(self, data: bytes) -> Any:
        if len(data) >= _HEADER and data[:2] == SINGLE_OBJECT_MAGIC:
            entry = self._registry.by_fingerprint(data[2:_HEADER])
            if entry is None or entry.name != ENVELOPE:
                raise UndecodableMessage(
                    f"unknown writer schema fingerprint {data[2:_HEADER].hex()}; "
                    "the message was written by a newer or foreign schema"
                )
            return entry.parsed
        if len(data) >= 5 and data[0] == CONFLUENT_MAGIC:
            (schema_id,) = struct.unpack(">I", data[1:5])
            if self._schema_ids is None:
                raise UndecodableMessage(
                    f"message uses the Confluent wire format (schema id {schema_id}) but no "
                    "schema registry is configured; set BLACKBOX_SCHEMA_REGISTRY_URL"
                )
            return self._schema_ids.writer_schema(schema_id)
        raise UndecodableMessage(
            f"not an envelope: starts with {data[:2].hex() or 'nothing'}, expected the "
            "single-object magic c301 or the Confluent magic 00"
        )


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A UUID as ``str(uuid.UUID(...))`` writes it."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
"""A timestamp as its microseconds times this: half the cost of ``timedelta(microseconds=...)``,
which parses its keyword every call."""


class _PlainReading:
    """Reads records of a schema through its plain Avro types, then turns the values of
    its logical-type fields into what fastavro would have made of them.

    fastavro's own logical readers cost a large part of a decode (62 against 33 us a
    decode in a micro-benchmark on a busy machine; 17k instructions an event under
    callgrind, about 3% of replaying it from the topic): a ``uuid``
    becomes a ``UUID`` object (parsed in Python) that the envelope turns straight back
    into its string, a ``timestamp-micros`` a datetime. Here a UUID string already in
    canonical form is kept as it is (``str(UUID(s)) == s``); any other goes through
    ``UUID`` as before, so a malformed one is refused the same way.
    """

    def __init__(self, schema: Any, uuids: tuple[str, ...], timestamps: tuple[str, ...]) -> None:
        self._schema = schema
        self._uuids = uuids
        self._timestamps = timestamps

    def read(self, body: io.BytesIO) -> Any:
        record: Any = schemaless_reader(body, self._schema, None)
        for name in self._uuids:
            value = record[name]
            if _CANONICAL_UUID.fullmatch(value) is None:
                record[name] = uuid.UUID(value)
        for name in self._timestamps:
            record[name] = _EPOCH + _MICROSECOND * record[name]
        return record


def _plain_reading(parsed: Any) -> _PlainReading | None:
    """How to read records of the parsed record schema ``parsed`` through plain types;
    None unless its only logical types are ``uuid`` and ``timestamp-micros`` fields of
    its own (not nested, not in unions)."""
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    fields: list[dict[str, Any]] = []
    uuids: list[str] = []
    timestamps: list[str] = []
    for entry in parsed["fields"]:
        kind: Any = entry["type"]
        logical = kind.get("logicalType") if isinstance(kind, dict) else None
        if logical == "uuid" and kind.get("type") == "string":
            uuids.append(entry["name"])
        elif logical == "timestamp-micros" and kind.get("type") == "long":
            timestamps.append(entry["name"])
        elif "logicalType" in repr(kind):
            return None
        else:
            fields.append(entry)
            continue
        fields.append({**entry, "type": kind["type"]})
    plain = {k: v for k, v in parsed.items() if not k.startswith("__")}
    schema = parse_schema({**plain, "fields": fields}, named_schemas={})
    return _PlainReading(schema, tuple(uuids), tuple(timestamps))


class BodyCodec:
    """Schemaless Avro for the type-specific bodies, by event type and version."""

    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self._registry = registry or default_registry()

    @property
    def registry(self) -> SchemaRegistry:
        """The schemas this codec reads and writes with."""
        return self._registry

    def encode(self, event_type: str, version: int, body: Mapping[str, Any]) -> bytes:
        """Encode ``body`` with the schema of ``event_type`` at ``version``.

        Raises:
            UnknownSchemaVersion: no such schema.
            BodyEncodingError: the body does not fit the schema.
        """
        schema = self._registry.get(event_type, version).parsed
        out = io.BytesIO()
        try:
            schemaless_writer(out, schema, dict(body), strict_allow_default=True)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise BodyEncodingError(event_type, version, str(exc)) from exc
        return out.getvalue()

    def decode(self, event_type: str, version: int, data: bytes) -> dict[str, Any]:
        """Decode a body written with the schema of ``event_type`` at ``version``.

        Raises:
            UnknownSchemaVersion: no such schema.
            UndecodableMessage: the bytes are not a body of that schema.
        """
        schema = self._registry.get(event_type, version).parsed
        try:
            record = schemaless_reader(io.BytesIO(data), schema)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise UndecodableMessage(
                f"{event_type} v{version} body is not valid Avro: {exc!r}"
            ) from exc
        if not isinstance(record, dict):
            raise UndecodableMessage(f"{event_type} v{version} body is not a record")
        return record
