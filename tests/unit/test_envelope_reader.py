"""The envelope read straight from its Avro record (``schemas/_envelope_reader.py``)
against fastavro's general path: the same envelope for every message either reads, the
same error for every message neither does, and no straight reading of a schema other
than the one it was written for."""

from __future__ import annotations

import json
import random
import string
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_blackbox.schemas import Envelope, EnvelopeCodec, UndecodableMessage
from agent_blackbox.schemas._envelope_reader import read_envelope, reader_for

SEEDS = range(400)
_HEADER = 10
_TEXT = string.ascii_letters + string.digits + '-_:. é€😀"\\\n\x01'


def _general() -> EnvelopeCodec:
    """A codec that never reads straight: fastavro's path, as before the reader."""
    codec = EnvelopeCodec()
    codec._read_own = None  # type: ignore[attr-defined]
    return codec


def _text(rng: random.Random, longest: int) -> str:
    return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, longest)))


def _maybe(rng: random.Random, longest: int) -> str | None:
    return None if rng.random() < 0.4 else _text(rng, longest)


def random_envelope(rng: random.Random) -> Envelope:
    """An envelope with every field drawn: lengths across the one-, two- and three-byte
    varints, empty and absent optionals, large and negative numbers."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=rng.choice([0, 1, -1, rng.randint(-(2**50), 2**50), 1_764_000_000_000_000])
    )
    payload = None if rng.random() < 0.3 else rng.randbytes(rng.choice([0, 5, 63, 64, 200, 9000]))
    return Envelope(
        event_id=str(uuid.UUID(int=rng.getrandbits(128))),
        run_id=_text(rng, 80),
        sequence=rng.choice([1, 2, 63, 64, 8191, 8192, 2**31, rng.randint(-(2**62), 2**62 - 1)]),
        event_type=_text(rng, 20),
        body_version=rng.choice([0, 1, 2, -1, 2**31 - 1, -(2**31)]),
        recorded_at=moment,
        tenant_id=_text(rng, 30),
        agent_id=_text(rng, 30),
        input_digest=_text(rng, 200),
        output_digest=_text(rng, 9000) if rng.random() < 0.05 else _text(rng, 90),
        chain_hash=_text(rng, 64),
        subject_ids=tuple(_text(rng, 12) for _ in range(rng.choice([0, 1, 3, 70]))),
        trace_id=_maybe(rng, 32),
        span_id=_maybe(rng, 16),
        parent_span_id=_maybe(rng, 16),
        payload=payload,
        payload_ref=_maybe(rng, 70),
        payload_encoding=_text(rng, 30),
        key_id=_maybe(rng, 40),
        classification=_text(rng, 12),
        retention_class=_text(rng, 12),
        attributes={_text(rng, 10): _text(rng, 40) for _ in range(rng.choice([0, 1, 2, 5, 70]))},
    )


def _fields(envelope: Envelope) -> dict[str, object]:
    return {name: getattr(envelope, name) for name in Envelope.__slots__}


@pytest.mark.parametrize("seed", SEEDS)
def test_random_envelopes_read_straight_as_fastavro_reads_them(seed: int) -> None:
    codec, general = EnvelopeCodec(), _general()
    data = codec.encode(random_envelope(random.Random(seed)))
    straight = read_envelope(data, _HEADER)
    assert straight is not None  # read straight, not handed on
    expected = general.decode(data)
    assert _fields(straight) == _fields(expected)
    assert [type(v) for v in _fields(straight).values()] == [
        type(v) for v in _fields(expected).values()
    ]
    assert codec.encode(straight) == data  # and it writes back to the same bytes


def test_the_recorders_events_read_straight_as_before() -> None:
    from agent_blackbox.outbox import MemoryRecorder, RunSnapshot

    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="t", input={"q": "é"})
    with recorder.start_run(snapshot, agent_id="agent") as run:
        run.call("tool", lambda x: {"x": x, "text": "é" * 300}, 1)
        run.now()
        run.random()
    codec, general = EnvelopeCodec(), _general()
    for envelope in recorder.events:
        data = codec.encode(envelope)
        assert read_envelope(data, _HEADER) is not None
        assert _fields(codec.decode(data)) == _fields(general.decode(data)) == _fields(envelope)


@pytest.mark.parametrize("seed", range(40))
def test_a_cut_or_lengthened_message_fails_as_before(seed: int) -> None:
    rng = random.Random(seed)
    data = EnvelopeCodec().encode(random_envelope(rng))
    cuts = {_HEADER, len(data) - 1, *(rng.randrange(_HEADER, len(data)) for _ in range(20))}
    broken = [data[:cut] for cut in cuts] + [data + b"\x00", data + rng.randbytes(7)]
    for message in broken:
        assert read_envelope(message, _HEADER) is None
        with pytest.raises(UndecodableMessage) as general:
            _general().decode(message)
        with pytest.raises(UndecodableMessage) as straight:
            EnvelopeCodec().decode(message)
        assert str(straight.value) == str(general.value)


@pytest.mark.parametrize("seed", range(200))
def test_flipped_bytes_read_as_fastavro_reads_them_or_fail_as_before(seed: int) -> None:
    rng = random.Random(seed)
    data = bytearray(EnvelopeCodec().encode(random_envelope(rng)))
    for _ in range(rng.choice([1, 2, 5])):
        data[rng.randrange(_HEADER, len(data))] = rng.randrange(256)
    message = bytes(data)
    try:
        expected: object = _fields(_general().decode(message))
    except UndecodableMessage as exc:
        expected = str(exc)
    try:
        got: object = _fields(EnvelopeCodec().decode(message))
    except UndecodableMessage as exc:
        got = str(exc)
    assert got == expected


def test_what_the_reader_is_not_sure_of_goes_the_general_way() -> None:
    codec = EnvelopeCodec()
    envelope = random_envelope(random.Random(1))
    upper = replace(envelope, event_id=envelope.event_id.upper())  # not canonical
    data = codec.encode(upper)
    assert read_envelope(data, _HEADER) is None
    assert codec.decode(data).event_id == envelope.event_id  # as fastavro's UUID gives it
    assert _fields(codec.decode(bytearray(data))) == _fields(_general().decode(data))


def test_no_straight_reading_of_another_schema() -> None:
    path = Path(__file__).parents[2] / "schemas" / "avsc" / "envelope.v1.avsc"
    schema = json.loads(path.read_text())
    assert reader_for(schema) is not None
    added = {**schema, "fields": [*schema["fields"], {"name": "x", "type": "string"}]}
    assert reader_for(added) is None
    swapped = {
        **schema,
        "fields": [schema["fields"][1], schema["fields"][0], *schema["fields"][2:]],
    }
    assert reader_for(swapped) is None
    retyped = {
        **schema,
        "fields": [{**schema["fields"][0], "type": "string"}, *schema["fields"][1:]],
    }
    assert reader_for(retyped) is None
