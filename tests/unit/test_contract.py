"""The shared contract: canonical JSON, digests, the envelope codec and the chain."""

from __future__ import annotations

import io
import json
import struct
import uuid
from dataclasses import FrozenInstanceError, fields, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from fastavro import schemaless_writer

from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    MAX_VALUE_DEPTH,
    BodyCodec,
    BodyEncodingError,
    Envelope,
    EnvelopeCodec,
    EventType,
    NotSerialisable,
    Settings,
    UndecodableMessage,
    UnknownSchemaVersion,
    canonical_json,
    canonical_text,
    default_registry,
    digest,
    digest_bytes,
    ordered_text,
    too_deep,
)

_STRING_FIELDS = [
    f.name for f in fields(Envelope) if f.type in ("str", "str | None") and f.name != "chain_hash"
]


def _envelope(**changes: Any) -> Envelope:
    base = Envelope(
        event_id="6f1c1c55-8a4b-4d55-9b0e-6f6f8f0e3a10",
        run_id="run-1",
        sequence=1,
        event_type="tool.call",
        body_version=1,
        recorded_at=datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC),
        tenant_id="acme",
        agent_id="ticket-agent",
        input_digest=digest({"tool": "x"}),
        output_digest=digest({"result": 1}),
        chain_hash="",
        subject_ids=("customer-1",),
        payload=b"\x02ab",
        attributes={"tool": "x"},
    )
    unchained = replace(base, **changes)
    return replace(unchained, chain_hash=unchained.expected_chain_hash(GENESIS_CHAIN_HASH))


def test_canonical_json_sorts_keys_strips_space_and_keeps_integers() -> None:
    value = {"b": 1, "a": [1.5, True, None, "é"], "c": {"z": 2, "y": 10**20}}
    assert canonical_json(value) == (
        '{"a":[1.5,true,null,"é"],"b":1,"c":{"y":100000000000000000000,"z":2}}'.encode()
    )


def test_digest_is_sha256_of_canonical_json() -> None:
    # Independent of key order and of tuple versus list.
    assert digest({"a": 1, "b": (1, 2)}) == digest({"b": [1, 2], "a": 1})
    assert digest({}) == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"a": [1, float("nan")]}, "$.a[1]", "nan is not a finite number"),
        ({"a": float("inf")}, "$.a", "inf is not a finite number"),
        ({"a": {"b": b"raw"}}, "$.a.b", "a bytes is not JSON-serialisable"),
        ({1: "x"}, "$", "key 1 is a int, not a str"),
        ([datetime(2026, 1, 1)], "$[0]", "a datetime is not JSON-serialisable"),
    ],
)
def test_canonical_json_names_the_bad_value(value: Any, path: str, reason: str) -> None:
    with pytest.raises(NotSerialisable) as caught:
        canonical_json(value)
    assert caught.value.path == path
    assert reason in str(caught.value)


def test_canonical_json_takes_subclasses_mappings_and_deep_values_as_before() -> None:
    from collections import OrderedDict

    assert canonical_json(OrderedDict(b=EventType.TOOL_CALL, a=(1, 2.5, False))) == (
        b'{"a":[1,2.5,false],"b":"tool.call"}'
    )
    with pytest.raises(NotSerialisable) as caught:
        canonical_json({"a": [{"ok": 1}, {2: "x"}]})
    assert caught.value.path == "$.a[1]"
    with pytest.raises(NotSerialisable) as caught:
        canonical_json({"a": ({"b": -float("inf")},)})
    assert caught.value.path == "$.a[0].b"


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


_JSON_CORPUS: list[Any] = [
    {"b": 1, "a": [1.5, True, None, "é"]},
    [0.1, 1e-07, 1e16, -0.0, 123456789.125, 2.5e-300, -(10**30)],
    {"esc": 'quote " backslash \\ tab \t nul \x00 bell \x07 del \x7f', "u": "\u2028\U0001f600"},
    {"": {"nested": [[], {}, [{}], ("tuple", 1)]}, "\u00e9": "key order by code point", "Z": 0},
    [True, False, None, "", 0, -1],
    "top-level string",
    7,
]


@pytest.mark.parametrize("value", _JSON_CORPUS)
def test_canonical_json_is_what_json_dumps_writes(value: Any) -> None:
    # canonical_json runs the C encoder directly (built once); it must stay byte for
    # byte what the documented json.dumps options write.
    expected = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert canonical_json(value) == expected.encode("utf-8")


@pytest.mark.parametrize("value", _JSON_CORPUS)
def test_ordered_text_is_canonical_json_but_for_key_order(value: Any) -> None:
    # Bodies store what replay hands back in it; digests stay over canonical JSON.
    text = ordered_text(value)
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert canonical_json(json.loads(text)) == canonical_json(value)
    assert len(text) == len(canonical_text(value))


def test_ordered_text_keeps_each_mappings_order_on_either_path() -> None:
    value = {"zeta": 1, "alpha": {"y": [{"b": 1, "a": 2}], "x": None}}
    assert ordered_text(value) == '{"zeta":1,"alpha":{"y":[{"b":1,"a":2}],"x":null}}'

    class Subclass(dict[str, Any]):
        """Not exactly a dict: written on the checked path."""

    assert ordered_text(Subclass(b=1, a=2)) == '{"b":1,"a":2}'


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": float("nan")}, "$.a"),
        ({"a": [float("inf")]}, "$.a[0]"),
        ({"a": object()}, "$.a"),
        ({1: "x"}, "$"),
        ({"a": _nested(MAX_VALUE_DEPTH)}, too_deep("$.a" + "[0]" * (MAX_VALUE_DEPTH - 1)).path),
    ],
)
def test_ordered_text_refuses_what_canonical_json_refuses(value: Any, path: str) -> None:
    with pytest.raises(NotSerialisable) as ordered:
        ordered_text(value)
    with pytest.raises(NotSerialisable) as canonical:
        canonical_text(value)
    assert ordered.value.path == canonical.value.path == path


@pytest.mark.parametrize("logical", [True, False], ids=["logical-types", "base-types"])
def test_envelope_record_round_trips_with_every_field_set(logical: bool) -> None:
    envelope = _envelope(
        trace_id="t",
        span_id="s",
        parent_span_id="p",
        payload=None,
        payload_ref="sha256:blob",
        payload_encoding="aes256gcm",
        key_id="dk-1",
        classification="sensitive",
        retention_class="short",
        subject_ids=("a", "b"),
    )
    record = envelope.to_record()
    if logical:
        record["event_id"] = uuid.UUID(envelope.event_id)
    else:
        record["recorded_at"] = envelope.recorded_at_us
    assert Envelope.from_record(record) == envelope


def test_an_envelope_from_a_record_is_a_frozen_envelope() -> None:
    envelope = _envelope()
    built = Envelope.from_record(envelope.to_record())
    assert type(built) is Envelope
    assert built == envelope
    with pytest.raises(FrozenInstanceError):
        built.run_id = "another"  # type: ignore[misc]
    assert replace(built, sequence=2).sequence == 2


def test_envelope_round_trips_as_single_object_encoding() -> None:
    codec = EnvelopeCodec()
    envelope = _envelope()
    data = codec.encode(envelope)
    entry = default_registry().latest("envelope")
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == entry.fingerprint
    assert codec.decode(data) == envelope


def test_fingerprint_is_crc64_avro_of_the_parsing_canonical_form() -> None:
    # The Avro specification's own example: the schema "int".
    from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

    canonical = to_parsing_canonical_form(parse_schema("int"))
    assert bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")) == bytes.fromhex("8f5c393f1ad57572")


@pytest.mark.parametrize(
    ("mangle", "complaint"),
    [
        (lambda d: b"garbage", "not an envelope"),
        (lambda d: b"", "not an envelope"),
        (lambda d: d[:2] + b"\x00" * 8 + d[10:], "unknown writer schema fingerprint"),
        (lambda d: d[:-5], "not valid Avro"),
        (lambda d: d + b"\x00\x00", "trailing bytes"),
        (lambda d: b"\x00\x00\x00\x00\x07" + d[10:], "no schema registry is configured"),
    ],
)
def test_corrupt_envelopes_raise_a_clear_error(mangle: Any, complaint: str) -> None:
    codec = EnvelopeCodec()
    with pytest.raises(UndecodableMessage, match=complaint):
        codec.decode(mangle(codec.encode(_envelope())))


@pytest.mark.parametrize(
    ("event_id", "read_as"),
    [
        ("ABCDEFAB-1234-1234-1234-1234567890AB", "abcdefab-1234-1234-1234-1234567890ab"),
        ("{abcdefab-1234-1234-1234-1234567890ab}", "abcdefab-1234-1234-1234-1234567890ab"),
        ("abcdefab-1234-1234-1234-1234567890ab", "abcdefab-1234-1234-1234-1234567890ab"),
        ("not a uuid", None),
    ],
)
def test_an_event_id_is_read_as_the_uuid_logical_type_reads_it(
    event_id: str, read_as: str | None
) -> None:
    # The codec reads the envelope's uuid and timestamp through their plain types (half
    # the cost of a decode) and must come to what fastavro's logical readers make of them.
    entry = default_registry().latest("envelope")
    body = io.BytesIO()
    body.write(b"\xc3\x01" + entry.fingerprint)
    record = {**_envelope().to_record(), "event_id": event_id}
    schemaless_writer(body, entry.parsed, record)
    if read_as is None:
        with pytest.raises(UndecodableMessage, match="not valid Avro: ValueError"):
            EnvelopeCodec().decode(body.getvalue())
        return
    decoded = EnvelopeCodec().decode(body.getvalue())
    assert decoded.event_id == read_as
    assert decoded.recorded_at == _envelope().recorded_at
    assert decoded.recorded_at.tzinfo is not None


def test_confluent_wire_format_is_read_through_a_schema_id_resolver() -> None:
    entry = default_registry().latest("envelope")

    class Registry:
        def writer_schema(self, schema_id: int) -> Any:
            assert schema_id == 42
            return entry.parsed

    envelope = _envelope()
    body = io.BytesIO()
    schemaless_writer(body, entry.parsed, envelope.to_record())
    framed = b"\x00" + struct.pack(">I", 42) + body.getvalue()
    assert EnvelopeCodec(schema_ids=Registry()).decode(framed) == envelope


@pytest.mark.parametrize(
    "change",
    [
        {"sequence": 2},
        {"event_type": "llm.call"},
        {"input_digest": digest({"tool": "y"})},
        {"payload": b"\x02ac"},
        {"attributes": {"tool": "y"}},
        {"subject_ids": ()},
    ],
)
def test_chain_hash_covers_every_field(change: dict[str, Any]) -> None:
    original = _envelope()
    altered = replace(original, **change)
    assert altered.expected_chain_hash(GENESIS_CHAIN_HASH) != original.chain_hash


def test_chain_hash_depends_on_the_previous_one() -> None:
    envelope = _envelope()
    assert envelope.expected_chain_hash("1" * 64) != envelope.chain_hash


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"payload": None, "payload_ref": "sha256:" + "ab" * 32},
        {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"},
        {"parent_span_id": "00f067aa0ba902b7", "key_id": "key-1", "payload_encoding": "aes"},
        {"subject_ids": ("a", "b\u00e9", 'quote"d'), "classification": "secret"},
        {"attributes": {"z": "last", "a": 'tab\tnew\nline "q" \\ \u2028', "\u00e9": "\x00"}},
        {"attributes": {"a\x00": "1", "a!": "2", 'a"': "3", "a\\": "4"}},
        *({name: 'a "quoted" value'} for name in _STRING_FIELDS),
        {"event_type": EventType.LLM_CALL, "sequence": 10**12, "body_version": 2},
        {"tenant_id": "日本", "agent_id": "a\x7fb", "retention_class": ""},
    ],
)
def test_chain_material_is_the_canonical_json_of_the_chain_record(change: dict[str, Any]) -> None:
    envelope = _envelope(**change)
    assert envelope.chain_material() == canonical_json(envelope.chain_record())


def test_chain_record_holds_every_field_but_the_chain_hash() -> None:
    record = _envelope().chain_record()
    assert set(record) == set(Envelope.__dataclass_fields__) - {"chain_hash"}
    assert record["recorded_at"] == 1796205600123456
    assert record["payload"] == digest_bytes(b"\x02ab")


@pytest.mark.parametrize(
    "change",
    [{"sequence": True}, {"attributes": {"n": 1}}, {"subject_ids": (None,)}, {"key_id": 7}],
)
def test_chain_material_of_fields_off_their_types_is_still_canonical_json(
    change: dict[str, Any],
) -> None:
    envelope = replace(_envelope(), **change)
    assert envelope.chain_material() == canonical_json(envelope.chain_record())


def test_chain_material_names_a_value_that_is_not_json() -> None:
    envelope = replace(_envelope(), attributes={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(NotSerialisable, match="key 1 is a int"):
        envelope.chain_material()


def test_every_body_schema_round_trips_its_defaults() -> None:
    registry = default_registry()
    codec = BodyCodec()
    assert set(registry.event_types()) >= {
        "run.started",
        "llm.call",
        "tool.call",
        "clock.read",
        "random.draw",
        "effect.intent",
        "effect.receipt",
        "state.transition",
        "run.finished",
    }
    body = {"tool": "t", "arguments_json": "{}", "latency_ms": 0.5}
    assert codec.decode("tool.call", 1, codec.encode("tool.call", 1, body))["tool"] == "t"


def test_body_that_does_not_fit_its_schema_names_the_field() -> None:
    with pytest.raises(BodyEncodingError, match="tool"):
        BodyCodec().encode("tool.call", 1, {"tool": 3, "arguments_json": "{}", "latency_ms": 1.0})


def test_unknown_schema_version_names_type_and_version() -> None:
    with pytest.raises(
        UnknownSchemaVersion, match=r"'tool\.call' version 7 \(known versions: 1, 2\)"
    ):
        BodyCodec().encode("tool.call", 7, {})
    with pytest.raises(UnknownSchemaVersion, match="not known at all"):
        BodyCodec().decode("no.such.type", 1, b"")


def test_settings_read_the_environment_once_and_validate_numbers() -> None:
    settings = Settings.from_env({"BLACKBOX_TOPIC": "t", "BLACKBOX_PARTITIONS": "3"})
    assert (settings.topic, settings.partitions, settings.dlq_topic) == ("t", 3, "t.dlq")
    with pytest.raises(ValueError, match="BLACKBOX_OUTBOX_SHARDS='zero' is not an integer"):
        Settings.from_env({"BLACKBOX_OUTBOX_SHARDS": "zero"})
