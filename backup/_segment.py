"""Event segments: one partition's messages over an offset range, as an Avro object
container file whose bytes depend only on the messages.

A segment keeps each Kafka message whole (offset, timestamp, key, value, headers), so a
restore produces the topic as it was, envelopes byte for byte. The file's sync marker is
derived from the topic, partition and first offset instead of drawn at random, so reading
the same range again after a crash writes the same bytes under the same content address.
"""

from __future__ import annotations

import hashlib
import io
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastavro import parse_schema, reader, writer
from fastavro.read import SchemaResolutionError
from fastavro.schema import SchemaParseException

from agent_blackbox.backup._errors import BackupCorrupt
from agent_blackbox.schemas import BlackboxError, Envelope, EnvelopeCodec, EventType

SEGMENT_CODEC = "deflate"

_SCHEMA = parse_schema(
    {
        "type": "record",
        "name": "BackedUpMessage",
        "namespace": "agent_blackbox.backup",
        "fields": [
            {"name": "offset", "type": "long"},
            {"name": "timestamp_ms", "type": "long"},
            {"name": "key", "type": ["null", "bytes"]},
            {"name": "value", "type": ["null", "bytes"]},
            {
                "name": "headers",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Header",
                        "fields": [
                            {"name": "key", "type": "string"},
                            {"name": "value", "type": ["null", "bytes"]},
                        ],
                    },
                },
            },
        ],
    }
)

_NO_EVENTS = hashlib.sha256(b"agent-blackbox backup event ids").hexdigest()


# What fastavro and zlib raise on bytes that are not a well-formed container file.
UNREADABLE_AVRO = (
    ValueError,
    EOFError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    zlib.error,
    SchemaResolutionError,
    SchemaParseException,
)


@dataclass(frozen=True, slots=True)
class Message:
    """One Kafka message as the backup keeps it."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(slots=True)
class RunSpan:
    """What one segment holds of one run: its first and last sequence and how many."""

    first_sequence: int
    last_sequence: int
    count: int


@dataclass(slots=True)
class SegmentBuilder:
    """The messages of one partition waiting to be written as a segment, with what the
    manifest says of them (runs, rolling digest of event ids), kept as they arrive."""

    topic: str
    partition: int
    codec: EnvelopeCodec
    messages: list[Message] = field(default_factory=list)
    runs: dict[str, RunSpan] = field(default_factory=dict)
    event_digest: str = _NO_EVENTS
    undecodable: int = 0
    size: int = 0
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Run → (last sequence, its chain hash) in this segment."""
    notes: list[Envelope] = field(default_factory=list)
    """The ``run.redacted`` notes (deletion ledger entries) in this segment."""

    def add(self, message: Message) -> None:
        """Take ``message``; an envelope that does not decode is kept all the same (the
        backup is of the topic) and counted."""
        self.messages.append(message)
        self.size += len(message.value or b"") + len(message.key or b"")
        try:
            envelope = self.codec.decode(message.value or b"")
        except BlackboxError:
            self.undecodable += 1
            return
        self.event_digest = roll_digest(self.event_digest, envelope.event_id)
        head = self.heads.get(envelope.run_id)
        if head is None or envelope.sequence > head[0]:
            self.heads[envelope.run_id] = (envelope.sequence, envelope.chain_hash)
        if envelope.event_type == EventType.RUN_REDACTED:
            self.notes.append(envelope)
        span = self.runs.get(envelope.run_id)
        if span is None:
            self.runs[envelope.run_id] = RunSpan(envelope.sequence, envelope.sequence, 1)
            return
        span.first_sequence = min(span.first_sequence, envelope.sequence)
        span.last_sequence = max(span.last_sequence, envelope.sequence)
        span.count += 1

    @property
    def first_offset(self) -> int:
        return self.messages[0].offset

    @property
    def last_offset(self) -> int:
        return self.messages[-1].offset

    def encode(self) -> bytes:
        """The segment file: the same bytes for the same messages, every time."""
        return encode_segment(self.topic, self.partition, self.messages)


def encode_segment(topic: str, partition: int, messages: Sequence[Message]) -> bytes:
    """An Avro container file of ``messages`` (one partition, ascending offsets)."""
    if not messages:
        raise ValueError("a segment holds at least one message")
    marker = hashlib.sha256(f"{topic}\0{partition}\0{messages[0].offset}".encode()).digest()
    out = io.BytesIO()
    writer(
        out,
        _SCHEMA,
        (_record(m) for m in messages),
        codec=SEGMENT_CODEC,
        sync_marker=marker[:16],
        metadata={"agent_blackbox.topic": topic, "agent_blackbox.partition": str(partition)},
    )
    return out.getvalue()


def decode_segment(data: bytes, *, key: str) -> Iterator[Message]:
    """The messages of a segment file.

    Raises:
        BackupCorrupt: naming ``key``: the bytes are not a segment file.
    """
    try:
        for record in reader(io.BytesIO(data), reader_schema=_SCHEMA):
            yield _message(record)
    except UNREADABLE_AVRO as exc:
        raise BackupCorrupt(f"backup object {key} is not a readable event segment: {exc}") from exc


def _record(message: Message) -> dict[str, Any]:
    return {
        "offset": message.offset,
        "timestamp_ms": message.timestamp_ms,
        "key": message.key,
        "value": message.value,
        "headers": [{"key": k, "value": v} for k, v in message.headers],
    }


def _message(record: Any) -> Message:
    return Message(
        offset=record["offset"],
        timestamp_ms=record["timestamp_ms"],
        key=record["key"],
        value=record["value"],
        headers=tuple((h["key"], h["value"]) for h in record["headers"]),
    )


NO_EVENTS_DIGEST = _NO_EVENTS
"""The rolling digest over no event ids: where every segment's digest starts."""


def roll_digest(digest: str, event_id: str) -> str:
    """The rolling digest over event ids after ``event_id``: SHA-256(digest ‖ event id)."""
    step = hashlib.sha256(bytes.fromhex(digest))
    step.update(event_id.encode())
    return step.hexdigest()
