"""RFC 8785 (JCS) canonical JSON for new runs, version 1 for the runs before it: the
serialiser against the RFC's examples and an independent implementation (``rfc8785``),
its refusals, and how a run's canonicalisation reaches its digests and its chain."""

from __future__ import annotations

import json
import math
import random
import struct
from dataclasses import replace
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.outbox._llm import llm_input
from agent_blackbox.replayer import read_archive, replay_run
from agent_blackbox.schemas import (
    C14N_ATTRIBUTE,
    CANONICAL_V1,
    GENESIS_CHAIN_HASH,
    RFC8785,
    BodyCodec,
    Envelope,
    KeyedDigest,
    NotSerialisable,
    PayloadPipeline,
    Settings,
    UnknownCanonicalisation,
    canonical_json,
    canonicalisation_of,
    digest,
    rfc8785_json,
)
from agent_blackbox.schemas._jcs import _write, es_number
from tests.golden.record_contract import support_agent

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"

# The RFC's own examples ---------------------------------------------------------------

# IEEE-754 bit patterns and the text JCS writes for them (RFC 8785, appendix B).
NUMBERS = {
    0x0000000000000000: "0",
    0x8000000000000000: "0",
    0x0000000000000001: "5e-324",
    0x8000000000000001: "-5e-324",
    0x7FEFFFFFFFFFFFFF: "1.7976931348623157e+308",
    0xFFEFFFFFFFFFFFFF: "-1.7976931348623157e+308",
    0x4340000000000000: "9007199254740992",
    0xC340000000000000: "-9007199254740992",
    0x4430000000000000: "295147905179352830000",
    0x44B52D02C7E14AF5: "9.999999999999997e+22",
    0x44B52D02C7E14AF6: "1e+23",
    0x44B52D02C7E14AF7: "1.0000000000000001e+23",
    0x444B1AE4D6E2EF4E: "999999999999999700000",
    0x444B1AE4D6E2EF4F: "999999999999999900000",
    0x444B1AE4D6E2EF50: "1e+21",
    0x3EB0C6F7A0B5ED8C: "9.999999999999997e-7",
    0x3EB0C6F7A0B5ED8D: "0.000001",
    0x41B3DE4355555553: "333333333.3333332",
    0x41B3DE4355555554: "333333333.33333325",
    0x41B3DE4355555555: "333333333.3333333",
    0x41B3DE4355555556: "333333333.3333334",
    0x41B3DE4355555557: "333333333.33333343",
    0xBECBF647612F3696: "-0.0000033333333333333333",
    0x43143FF3C1CB0959: "1424953923781206.2",
}


def _double(bits: int) -> float:
    value: float = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    return value


@pytest.mark.parametrize(("bits", "text"), sorted(NUMBERS.items()))
def test_numbers_are_written_as_the_rfc_writes_them(bits: int, text: str) -> None:
    value = _double(bits)
    assert es_number(value) == text
    assert rfc8785_json(value) == text.encode()
    assert rfc8785_json([value]) == f"[{text}]".encode()


def test_the_rfcs_sample_object_comes_out_as_printed() -> None:
    value = json.loads(
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert rfc8785_json(value).decode() == expected


def test_keys_sort_by_utf16_code_units_not_code_points() -> None:
    keys = ["\u20ac", "\r", "\ufb33", "1", "\U0001f600", "\u0080", "\u00f6"]
    value = {key: index for index, key in enumerate(keys)}
    written = json.loads(rfc8785_json(value))
    # The emoji's surrogates (U+D83D...) sort before U+FB33; by code point it is last.
    assert list(written) == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert list(json.loads(canonical_json(value)))[-1] == "\U0001f600"


# Against an independent implementation ------------------------------------------------


def test_random_doubles_are_written_as_the_independent_implementation_writes_them() -> None:
    draw = random.Random(8785)
    checked = 0
    while checked < 20_000:
        value = _double(draw.getrandbits(64))
        if not math.isfinite(value):
            continue
        assert rfc8785_json(value) == rfc8785.dumps(value), value.hex()
        checked += 1


def _random_value(draw: random.Random, depth: int = 0) -> Any:
    kinds = ["str", "int", "float", "bool", "null"] + (["list", "dict"] * 2 if depth < 4 else [])
    kind = draw.choice(kinds)
    if kind == "str":
        return "".join(draw.choice(_CHARACTERS) for _ in range(draw.randint(0, 6)))
    if kind == "int":
        return draw.randint(-(2**53), 2**53)
    if kind == "float":
        return draw.choice([draw.uniform(-1e6, 1e6), 10.0 ** draw.randint(-30, 30), 1.0, -0.0])
    if kind == "bool":
        return draw.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_random_value(draw, depth + 1) for _ in range(draw.randint(0, 4))]
    keys = ("".join(draw.choice(_CHARACTERS) for _ in range(3)) for _ in range(draw.randint(0, 4)))
    return {key: _random_value(draw, depth + 1) for key in keys}


# Plain letters, what JSON escapes, and the characters whose two sort orders differ.
_CHARACTERS = ["a", "b", "Z", '"', "\\", "\n", "\x01", "\x7f", "é", "\u2028", "\ue000", "\ufb33"]
_CHARACTERS += ["\U0001f600", "\U00010000"]


def test_random_values_are_written_as_the_independent_implementation_writes_them() -> None:
    draw = random.Random(32)
    for _ in range(3_000):
        value = _random_value(draw)
        written = rfc8785_json(value)
        assert written == rfc8785.dumps(value)
        slow: list[str] = []
        _write(value, "$", 0, slow)  # the path the C encoder does not take
        assert "".join(slow).encode() == written


def test_a_text_taken_beside_the_version_1_text_is_the_canonical_text() -> None:
    """Where both forms write a value alike, its version 1 text is taken for it (the
    request memo writes both for every new part); elsewhere it is written anew."""
    draw = random.Random(33)
    alike = 0
    for _ in range(3_000):
        value = _random_value(draw)
        v1 = canonical_json(value).decode("utf-8")
        for canonical in (CANONICAL_V1, RFC8785):
            assert canonical.json_beside(value, v1) == canonical.json(value).decode("utf-8")
        alike += RFC8785.as_v1(value)
    assert 300 < alike < 2_700, "too few values of one kind to tell"


# What each form refuses or writes its own way ------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, {"b": math.nan}]}, "$.a[1].b"),
        ({"top_p": -math.inf}, "$.top_p"),
        ({"k": ["fine", "\ud800"]}, "$.k[1]"),
        ({"\udc00": 1}, "$"),
        ({"a": {1: 2}}, "$.a"),
        ({"n": 10**400}, "$.n"),
        ({"o": object()}, "$.o"),
    ],
)
def test_a_value_without_a_json_form_is_refused_naming_where(value: Any, path: str) -> None:
    with pytest.raises(NotSerialisable) as refused:
        rfc8785_json(value)
    assert refused.value.path == path


def test_integers_past_two_to_the_53_are_written_as_the_double_they_read_as() -> None:
    # JSON numbers are doubles: what a JCS implementation writes after reading the text.
    assert rfc8785_json(2**53) == b"9007199254740992"
    assert rfc8785_json(2**53 + 1) == b"9007199254740992"
    assert rfc8785_json(12345678901234567890) == b"12345678901234567000"
    assert rfc8785_json(10**21) == b"1e+21"
    assert canonical_json(2**53 + 1) == b"9007199254740993"  # version 1: its digits


def test_the_two_forms_differ_where_the_issue_found_them() -> None:
    request = {"top_p": 1e-05, "temperature": 1.0, "seed": 2**53 + 1, "n": -0.0}
    assert canonical_json(request) == (
        b'{"n":-0.0,"seed":9007199254740993,"temperature":1.0,"top_p":1e-05}'
    )
    assert rfc8785_json(request) == (
        b'{"n":0,"seed":9007199254740992,"temperature":1,"top_p":0.00001}'
    )
    assert RFC8785.digest(request) != digest(request)
    assert CANONICAL_V1.digest is digest


def test_a_keyed_digest_keeps_its_key_over_another_canonicalisation() -> None:
    keyed = KeyedDigest(b"k" * 32)
    jcs = keyed.under(RFC8785)
    assert keyed.canonical is CANONICAL_V1
    assert jcs.canonical is RFC8785
    assert jcs({"a": "b"}) == keyed({"a": "b"})  # both forms write this alike
    assert jcs({"a": 1.0}) != keyed({"a": 1.0})
    assert jcs.under(CANONICAL_V1)({"a": 1.0}) == keyed({"a": 1.0})


def test_settings_name_the_canonicalisation_of_new_runs() -> None:
    assert Settings().canonicalisation is RFC8785
    assert Settings.from_env({"BLACKBOX_CANONICAL_JSON": "v1"}).canonicalisation is CANONICAL_V1
    with pytest.raises(ValueError, match="BLACKBOX_CANONICAL_JSON"):
        Settings(canonical_json="jcs")


# The chain and the envelope ------------------------------------------------------------


def _envelope(**changes: Any) -> Envelope:
    base = Envelope(
        event_id="00000000-0000-4000-8000-000000000001",
        run_id="run-1",
        sequence=1,
        event_type="tool.call",
        body_version=2,
        recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
        tenant_id="t",
        agent_id="a",
        input_digest="sha256:00",
        output_digest="sha256:11",
        chain_hash="",
        payload=b"\x00\x01",
        attributes={C14N_ATTRIBUTE: "rfc8785"},
    )
    return replace(base, **changes)


@pytest.mark.parametrize(
    "attributes",
    [
        {C14N_ATTRIBUTE: "rfc8785"},
        {C14N_ATTRIBUTE: "rfc8785", "tool": "lookup", "latency_ms": "0.1"},
        {C14N_ATTRIBUTE: "rfc8785", "tag.\ufb33": "x", "tag.\U0001f600": 'q"\n'},
        {"tag.\ufb33": "x", "tag.\U0001f600": "y"},
    ],
)
@pytest.mark.parametrize(
    "fields",
    [{}, {"agent_id": 'ag"ent\\\u0001', "subject_ids": ("s\n1",)}],
    ids=["plain-fields", "escaped-fields"],
)
def test_the_chain_material_is_the_canonical_json_of_the_chain_record(
    attributes: dict[str, str], fields: dict[str, Any]
) -> None:
    envelope = _envelope(attributes=attributes, **fields)
    canonical = canonicalisation_of(attributes)
    assert envelope.chain_material() == canonical.json(envelope.chain_record())


def test_the_two_chains_differ_only_where_the_key_orders_do() -> None:
    odd = {"tag.\ufb33": "x", "tag.\U0001f600": "y"}
    v1 = _envelope(attributes=odd)
    jcs = _envelope(attributes={**odd, C14N_ATTRIBUTE: "rfc8785"})
    assert v1.chain_material() == canonical_json(v1.chain_record())
    assert jcs.chain_material() == rfc8785.dumps(jcs.chain_record())
    assert list(json.loads(v1.chain_material())["attributes"]) == list(odd)
    assert list(json.loads(jcs.chain_material())["attributes"])[1:] == list(odd)[::-1]


def test_numbers_past_two_to_the_53_leave_the_fast_chain_path() -> None:
    envelope = _envelope(sequence=2**53 + 1, recorded_at=datetime(2300, 1, 1, tzinfo=UTC))
    assert envelope.chain_material() == rfc8785.dumps(
        {**envelope.chain_record(), "sequence": float(2**53 + 1)}
        | {"recorded_at": float(envelope.recorded_at_us)}
    )


def test_an_unknown_canonicalisation_is_refused_by_name() -> None:
    envelope = _envelope(attributes={C14N_ATTRIBUTE: "rfc9999"})
    with pytest.raises(UnknownCanonicalisation, match="rfc9999"):
        envelope.expected_chain_hash(GENESIS_CHAIN_HASH)
    with pytest.raises(UnknownCanonicalisation):
        canonicalisation_of({C14N_ATTRIBUTE: "v1"})  # version 1 is never written


# Recording and replaying ---------------------------------------------------------------

REQUEST = {
    "model": "m",
    "top_p": 1e-05,
    "temperature": 1.0,
    "logit_bias": {"50256": -100.0, "13": 1e-7},
    "seed": 2**53 + 1,
    "messages": [{"role": "user", "content": "hi"}],
}


def _agent(run: AgentRun, input: Any) -> Any:
    reply = run.llm(lambda r: {"id": "r1", "choices": [], "score": 1e21}, REQUEST, provider="x")
    run.transition("done", state={"ratio": 2.5e-8, "whole": 3.0})
    return reply["id"]


def _record(canonical_json: str) -> list[Envelope]:
    recorder = MemoryRecorder(settings=replace(Settings(), canonical_json=canonical_json))
    recorder.record(_agent, RunSnapshot("c14n.1", input={"x": 0.5}), agent_id="c14n")
    return recorder.events


def test_new_runs_hash_rfc8785_and_name_it_on_every_envelope() -> None:
    events = _record("rfc8785")
    assert all(e.attributes[C14N_ATTRIBUTE] == "rfc8785" for e in events)
    llm = next(e for e in events if e.event_type == "llm.call")
    assert llm.input_digest == RFC8785.digest(llm_input("x", "m", REQUEST))
    assert llm.input_digest != digest(llm_input("x", "m", REQUEST))
    head = GENESIS_CHAIN_HASH
    for envelope in events:
        assert envelope.chain_hash == envelope.expected_chain_hash(head)
        head = envelope.chain_hash
    report = replay_run(events, _agent)
    assert report.passed, report.divergence and report.divergence.describe()


def test_bodies_keep_texts_that_read_back_as_the_recorded_values() -> None:
    events = _record("rfc8785")
    bodies = {e.event_type: PayloadPipeline().unpack(e) for e in events}
    # Replay hands these back: a float stays a float, an integer keeps its digits.
    assert json.loads(bodies["llm.call"]["raw_request_json"]) == REQUEST
    assert json.loads(bodies["state.transition"]["state_json"]) == {"ratio": 2.5e-8, "whole": 3.0}
    finished = bodies["run.finished"]
    assert finished["final_state_digest"] == RFC8785.digest({"ratio": 2.5e-8, "whole": 3.0})


def test_a_recorder_set_to_version_1_records_as_earlier_releases_did() -> None:
    events = _record("v1")
    assert not any(C14N_ATTRIBUTE in e.attributes for e in events)
    llm = next(e for e in events if e.event_type == "llm.call")
    assert llm.input_digest == digest(llm_input("x", "m", REQUEST))
    assert replay_run(events, _agent).passed


def test_every_golden_history_still_chains_under_its_own_canonicalisation() -> None:
    for archive in sorted(GOLDEN_DIR.glob("*.avro")):
        heads: dict[str, str] = {}
        for envelope in read_archive(archive):
            previous = heads.get(envelope.run_id, GENESIS_CHAIN_HASH)
            assert envelope.chain_hash == envelope.expected_chain_hash(previous), archive.name
            heads[envelope.run_id] = envelope.chain_hash


def _conversing_agent(run: AgentRun, input: Any) -> Any:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief " * 60}]
    for turn in range(3):
        messages.append({"role": "user", "content": f"question {turn}", "weight": 1e-9})
        request = {"model": "m", "top_p": 1e-05, "temperature": 0.0, "messages": list(messages)}
        reply = run.llm(lambda r, n=turn: {"id": f"r{n}", "choices": []}, request, provider="x")
        messages.append({"role": "assistant", "content": reply["id"]})
    return len(messages)


def test_requests_stored_by_reference_rebuild_against_their_rfc8785_digest() -> None:
    recorder = MemoryRecorder(settings=Settings(payload_compression="none"))
    recorder.record(_conversing_agent, RunSnapshot("c14n.2", input=None), agent_id="c14n")
    calls = [e for e in recorder.events if e.event_type == "llm.call"]
    pipeline = PayloadPipeline()
    bodies = [pipeline.unpack(e) for e in calls]
    raw = [BodyCodec().decode("llm.call", 4, e.payload or b"") for e in calls]
    assert [b["request_prefix"] is not None for b in raw] == [False, True, True]
    for body, envelope in zip(bodies, calls, strict=True):
        request = json.loads(body["raw_request_json"])
        assert envelope.input_digest == RFC8785.digest(llm_input("x", "m", request))
    assert raw[1]["request_prefix"]["request_sha256"] == RFC8785.digest(
        json.loads(bodies[1]["raw_request_json"])
    )
    assert replay_run(recorder.events, _conversing_agent).passed


def test_the_rfc8785_golden_history_replays() -> None:
    events = read_archive(GOLDEN_DIR / "contract.rfc8785.avro")
    runs = {run: list(group) for run, group in groupby(events, lambda e: e.run_id)}
    assert len(runs) == 4
    for run in runs.values():
        assert {e.attributes[C14N_ATTRIBUTE] for e in run} == {"rfc8785"}
        report = replay_run(run, support_agent)
        assert report.passed, report.divergence and report.divergence.describe()
