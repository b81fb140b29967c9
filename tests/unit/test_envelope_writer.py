"""The recorder's straight writer of the envelope writes the bytes fastavro writes, and
leaves to fastavro what it does not write; its event ids are what uuid4 makes."""

from __future__ import annotations

import io
import random
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fastavro import schemaless_writer

from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.schemas import Envelope, EnvelopeCodec, EventType
from agent_blackbox.schemas._envelope_writer import write_envelope

CODEC = EnvelopeCodec()
WRITER = CODEC._writer  # the schema fastavro writes with


def _fastavro(envelope: Envelope) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, WRITER, envelope.to_record())
    return out.getvalue()


TEXTS = ["", "a", "é", "名前", "\x00\x7f", '"quoted" \\ back', "x" * 63, "y" * 64, "z" * 300, "🙂"]


def _envelope(rng: random.Random, **fields: Any) -> Envelope:
    def text() -> str:
        return rng.choice(TEXTS) + str(rng.randrange(10**6))

    def maybe() -> str | None:
        return None if rng.random() < 0.5 else text()

    values: dict[str, Any] = {
        "event_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "run_id": text(),
        "sequence": rng.choice([1, 63, 64, 127, 128, 2**31, 2**63 - 1, -1, -(2**63)]),
        "event_type": rng.choice([*EventType, "custom.type"]),
        "body_version": rng.choice([0, 1, 2, 63, 64, 2**31 - 1, -(2**31)]),
        "recorded_at": datetime(2026, 1, 2, tzinfo=UTC)
        + timedelta(microseconds=rng.randrange(-(10**15), 10**15)),
        "tenant_id": text(),
        "agent_id": text(),
        "subject_ids": tuple(text() for _ in range(rng.randrange(4))),
        "trace_id": maybe(),
        "span_id": maybe(),
        "parent_span_id": maybe(),
        "input_digest": text(),
        "output_digest": text(),
        "chain_hash": text(),
        "payload": rng.choice([None, b"", bytes(rng.randrange(256) for _ in range(200))]),
        "payload_ref": maybe(),
        "payload_encoding": text(),
        "key_id": maybe(),
        "classification": text(),
        "retention_class": text(),
        "attributes": {text(): text() for _ in range(rng.randrange(5))},
    }
    values.update(fields)
    return Envelope(**values)


def test_the_straight_writer_writes_what_fastavro_writes() -> None:
    rng = random.Random(12)
    for _ in range(2_000):
        envelope = _envelope(rng)
        assert write_envelope(envelope) == _fastavro(envelope), envelope
        assert CODEC.decode(CODEC.encode(envelope)) == envelope


def test_another_offset_than_utc_is_written_as_its_instant() -> None:
    moment = datetime(2026, 5, 1, 12, tzinfo=timezone(timedelta(hours=-7)))
    envelope = _envelope(random.Random(3), recorded_at=moment)
    assert write_envelope(envelope) == _fastavro(envelope)


@pytest.mark.parametrize(
    "fields",
    [
        {"recorded_at": datetime(2026, 1, 2, 3, 4, 5)},  # naive: fastavro's own reading
        {"event_id": uuid.UUID(int=7)},  # a UUID object, which fastavro writes as text
        {"body_version": 2**31},  # out of an int's range
        {"payload": bytearray(b"abc")},
    ],
)
def test_what_the_straight_writer_does_not_write_goes_to_fastavro(fields: Any) -> None:
    envelope = _envelope(random.Random(5), **fields)
    with pytest.raises((TypeError, AttributeError, ValueError, OverflowError)):
        write_envelope(envelope)
    try:
        expected: bytes | type[BaseException] = _fastavro(envelope)
    except Exception as exc:  # fastavro refuses it: so does the codec, the same way
        expected = type(exc)
    if isinstance(expected, bytes):
        assert CODEC.encode(envelope)[10:] == expected
    else:
        with pytest.raises(expected):
            CODEC.encode(envelope)


def test_a_field_of_the_wrong_type_is_refused_as_fastavro_refuses_it() -> None:
    envelope = _envelope(random.Random(9), sequence="5")
    with pytest.raises((TypeError, ValueError)):
        CODEC.encode(envelope)


def test_event_ids_are_random_uuids_in_canonical_form() -> None:
    ids = {new_event_id() for _ in range(2_000)}
    assert len(ids) == 2_000
    for event_id in ids:
        parsed = uuid.UUID(event_id)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, event_id)
    assert {event_id[19] for event_id in ids} == set("89ab")
