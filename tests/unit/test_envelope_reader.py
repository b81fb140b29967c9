"""The straight envelope reader: the same envelope as fastavro, or it stands aside.

Each case decodes bytes twice, with the codec (straight reader first) and with fastavro
alone, and expects the same envelope or the same error. Mutated and truncated bytes
probe that the straight reader never accepts what fastavro refuses, nor reads a field
differently.
"""

from __future__ import annotations

import io
import random
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from fastavro import schemaless_writer

from agent_blackbox.schemas import Envelope, EnvelopeCodec, UndecodableMessage, default_registry
from agent_blackbox.schemas._envelope_reader import LAYOUT, fits, read_envelope

ENVELOPE = Envelope(
    event_id="6f1c1c55-8a4b-4d55-9b0e-6f6f8f0e3a10",
    run_id="run-1",
    sequence=1,
    event_type="tool.call",
    body_version=1,
    recorded_at=datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC),
    tenant_id="acme",
    agent_id="ticket-agent",
    input_digest="sha256:" + "a" * 64,
    output_digest="sha256:" + "b" * 64,
    chain_hash="c" * 64,
)

VARIANTS: list[dict[str, Any]] = [
    {},
    {"subject_ids": ("customer-1", "customer-2"), "attributes": {"tool": "x", "é": "ü"}},
    {"trace_id": "t" * 32, "span_id": "s" * 16, "parent_span_id": "p" * 16},
    {"payload": b"\x00\x01" * 300, "key_id": "key-1", "payload_encoding": "aes-gcm"},
    {"payload_ref": "sha256:" + "d" * 64, "classification": "restricted"},
    {"sequence": 2**62, "body_version": -(2**31)},  # a ten-byte varint: fastavro reads it
    {"sequence": 2**40, "run_id": "r" * 5000},  # multi-byte lengths
    {"recorded_at": datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC)},  # before the epoch
    {"recorded_at": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)},
    {"tenant_id": "", "agent_id": "🤖", "attributes": {"": ""}},
]


def _encoded(envelope: Envelope, *, record: dict[str, Any] | None = None) -> bytes:
    return EnvelopeCodec().encode(envelope) if record is None else _raw(record)


def _raw(record: dict[str, Any]) -> bytes:
    entry = default_registry().latest("envelope")
    out = io.BytesIO()
    out.write(b"\xc3\x01" + entry.fingerprint)
    schemaless_writer(out, entry.parsed, record)
    return out.getvalue()


def _slow(data: bytes) -> Envelope | str:
    codec = EnvelopeCodec()
    codec._fast = {data[2:10]: False}  # fastavro alone, as before the straight reader
    try:
        return codec.decode(data)
    except UndecodableMessage as exc:
        return str(exc)


def _fast(data: bytes) -> Envelope | str:
    try:
        return EnvelopeCodec().decode(data)
    except UndecodableMessage as exc:
        return str(exc)


def test_the_reader_is_written_for_the_current_envelope_schema() -> None:
    parsed = default_registry().latest("envelope").parsed
    assert fits(parsed)
    assert [name for name, _ in LAYOUT] == [f["name"] for f in parsed["fields"]]
    assert not fits({"type": "record", "name": "x", "fields": []})


@pytest.mark.parametrize("changes", VARIANTS)
def test_every_field_reads_as_fastavro_reads_it(changes: dict[str, Any]) -> None:
    data = _encoded(replace(ENVELOPE, **changes))
    straight = read_envelope(data, 10)
    if changes.get("sequence") == 2**62:
        assert straight is None  # beyond nine varint bytes: left to fastavro
    else:
        assert straight is not None
        assert straight == _slow(data)
    assert _fast(data) == _slow(data)


def test_an_event_id_in_another_spelling_goes_through_fastavro() -> None:
    record = ENVELOPE.to_record() | {"event_id": "{6F1C1C55-8A4B-4D55-9B0E-6F6F8F0E3A10}"}
    data = _raw(record)
    assert read_envelope(data, 10) is None
    decoded = _fast(data)
    assert isinstance(decoded, Envelope)
    assert decoded.event_id == ENVELOPE.event_id  # normalised by uuid.UUID, as before
    bad = _raw(ENVELOPE.to_record() | {"event_id": "not-a-uuid"})
    assert read_envelope(bad, 10) is None
    assert _fast(bad) == _slow(bad)
    assert isinstance(_fast(bad), str)


def test_mutated_and_truncated_bytes_decode_as_fastavro_decodes_them() -> None:
    rng = random.Random(12)
    originals = [_encoded(replace(ENVELOPE, **changes)) for changes in VARIANTS]
    for _ in range(3000):  # (run with 300,000 once: no difference)
        data = bytearray(rng.choice(originals))
        how = rng.randrange(3)
        if how == 0:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(10, len(data))] = rng.randrange(256)
        elif how == 1:
            del data[rng.randrange(10, len(data)) :]
        else:
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        assert _fast(bytes(data)) == _slow(bytes(data)), bytes(data).hex()
