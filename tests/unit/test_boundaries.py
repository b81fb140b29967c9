"""What each boundary records, without a database."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_blackbox.outbox._boundaries import clock_read, tool_call
from agent_blackbox.outbox._errors import PayloadTooLarge
from agent_blackbox.outbox._llm import llm_call
from agent_blackbox.outbox._writer import Cursor, EventFactory, RunIdentity
from agent_blackbox.outbox.storage import shard_of
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    LLM_CALL_VERSION,
    EnvelopeCodec,
    PayloadPipeline,
    Settings,
    digest,
    llm_reply,
)
from tests.integration._kafka import murmur2

RESPONSE = {
    "id": "chatcmpl-1",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
}


def _factory(**settings: int) -> EventFactory:
    return EventFactory(
        settings=Settings(**settings),  # type: ignore[arg-type]
        pipeline=PayloadPipeline(),
        codec=EnvelopeCodec(),
        clock=lambda: datetime(2026, 12, 2, tzinfo=UTC),
    )


def test_latency_is_recorded_but_not_digested() -> None:
    fast = tool_call(tool="t", args=(1,), kwargs={}, result=2, error=None, latency_ms=0.1)
    slow = tool_call(tool="t", args=(1,), kwargs={}, result=2, error=None, latency_ms=900.0)
    assert digest(fast.output) == digest(slow.output)
    assert fast.body["latency_ms"] != slow.body["latency_ms"]


def test_tool_error_is_recorded_by_class_message_and_arguments() -> None:
    crossing = tool_call(
        tool="t", args=(), kwargs={}, result=None, error=KeyError("T-9"), latency_ms=1.0
    )
    assert crossing.body["error"] == {
        "type": "KeyError",
        "message": "'T-9'",
        "module": "builtins",
        "args_json": '["T-9"]',
    }
    assert crossing.version == 2
    assert crossing.attributes["error"] == "KeyError"


def test_llm_call_attributes_say_whether_it_streamed_and_how_many_tools_it_asked_for() -> None:
    plain = llm_call(
        provider="openai",
        model="m",
        request={"model": "m"},
        response=RESPONSE,
        error=None,
        latency_ms=1.0,
    )
    streamed = llm_call(
        provider="openai",
        model="m",
        request={"model": "m", "stream": True},
        response={"choices": []},
        error=None,
        latency_ms=1.0,
    )
    assert plain.attributes["tool_calls_requested"] == "1"
    assert "streamed" not in plain.attributes
    assert streamed.attributes["streamed"] == "true"
    assert "tool_calls_requested" not in streamed.attributes


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
                "additionalProperties": False,
            },
        },
    }
]


def _asked(arguments: str, name: str = "lookup") -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


@pytest.mark.parametrize(
    ("arguments", "name", "invalid"),
    [
        ('{"q": "x"}', "lookup", "0"),
        ('{"q": 3}', "lookup", "1"),
        ('{"q": "x", "extra": 1}', "lookup", "1"),
        ('{"q": "x"', "lookup", "1"),  # not JSON at all
        ('{"q": 3}', "unknown_tool", None),  # no schema declared: validity unknown
    ],
)
def test_the_model_s_tool_arguments_are_checked_against_the_declared_schema(
    arguments: str, name: str, invalid: str | None
) -> None:
    request = {"model": "m", "tools": _TOOLS}
    crossing = llm_call(
        provider="openai",
        model="m",
        request=request,
        response=_asked(arguments, name),
        error=None,
        latency_ms=1.0,
    )
    assert crossing.attributes.get("tool_calls_invalid") == invalid
    if invalid == "1":
        assert crossing.attributes["tool_calls_invalid_names"] == name


def test_llm_call_stores_the_response_once_and_derives_choices_and_tool_calls() -> None:
    request = {"model": "m", "temperature": 0.2, "messages": [{"role": "user", "content": "hi"}]}
    crossing = llm_call(
        provider="openai",
        model="m",
        request=request,
        response=RESPONSE,
        error=None,
        latency_ms=12.0,
    )
    body = crossing.body
    assert body["request_params_json"] == '{"temperature":0.2}'
    assert crossing.version == LLM_CALL_VERSION == 4
    assert "choices" not in body
    assert "tool_calls" not in body
    assert json.loads(body["raw_response_json"]) == RESPONSE
    reply = llm_reply(body)
    assert reply.choices == (
        {"index": 0, "role": "assistant", "content": None, "finish_reason": "tool_calls"},
    )
    assert list(reply.tool_calls) == [
        {
            "id": "call-1",
            "type": "function",
            "name": "lookup",
            "arguments_json": '{"q":"x"}',
            "arguments_raw": None,
        }
    ]
    assert body["finish_reason"] == "tool_calls"
    assert body["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cached_tokens": 0,
        "total_tokens": 15,
    }
    assert body["response_id"] == "chatcmpl-1"
    assert crossing.attributes["total_tokens"] == "15"


def test_factory_chains_events_and_moves_large_bodies_out_of_line() -> None:
    factory = _factory(blob_threshold_bytes=100, max_blob_bytes=10_000)
    identity = RunIdentity(run_id="r", tenant_id="t", agent_id="a", shard=0)
    small = factory.prepare(identity, Cursor(), clock_read(clock="wall", value_us=1), event_id="e1")
    assert small.envelope.sequence == 1
    assert small.envelope.chain_hash == small.envelope.expected_chain_hash(GENESIS_CHAIN_HASH)
    big = tool_call(tool="t", args=(), kwargs={}, result="x" * 500, error=None, latency_ms=1.0)
    large = factory.prepare(identity, small.cursor, big, event_id="e2")
    assert large.envelope.sequence == 2
    assert large.envelope.payload is None
    assert large.blob is not None
    assert large.envelope.payload_ref == large.blob[0]
    assert (
        large.envelope.expected_chain_hash(small.envelope.chain_hash) == large.envelope.chain_hash
    )
    huge = tool_call(tool="t", args=(), kwargs={}, result="x" * 20_000, error=None, latency_ms=1)
    with pytest.raises(PayloadTooLarge):
        factory.prepare(identity, small.cursor, huge, event_id="e3")


def test_shard_of_is_stable_and_in_range() -> None:
    assert shard_of("run-1", 16) == shard_of("run-1", 16)
    assert {shard_of(f"run-{i}", 16) for i in range(500)} == set(range(16))


@pytest.mark.parametrize(
    ("key", "java_hash"),
    # Kafka's own vectors for Utils.murmur2 (signed, as Java prints them).
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(key: bytes, java_hash: int) -> None:
    assert murmur2(key) == java_hash & 0xFFFFFFFF


def test_composed_output_json_is_the_canonical_json_of_the_recorded_output() -> None:
    # Replay digests outputs from the body's own JSON texts; they must be exactly the
    # canonical JSON of the value it hands back, for every kind it composes, unless they
    # hold a tool's result (or hits) in its own key order: then only the value is the
    # same, and replay digests the value.
    from pathlib import Path

    from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
    from agent_blackbox.outbox._boundaries import recorded_output, recorded_output_json
    from agent_blackbox.replayer import read_archive
    from agent_blackbox.schemas import PayloadPipeline, canonical_json

    def agent(run: AgentRun, input: Any) -> Any:
        run.call("t", lambda: {"é": [1.5, 1e-07, None, "x\\u2028"], "n": -(10**20)})
        with pytest.raises(RuntimeError):
            run.call("fails", _raise)
        run.random(), run.randint(1, 6), run.uuid(), run.now(), run.monotonic()
        run.transition("s", state={"b": [True, 0.1], "a": "ü"})
        return None

    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot("c.1"), agent_id="c")
    golden = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v1.avro"
    events = [*recorder.events, *read_archive(golden)]
    pipeline, composed, reordered = PayloadPipeline(), 0, 0
    for envelope in events:
        body = pipeline.unpack(envelope)
        material = recorded_output_json(envelope.event_type, body)
        if material is not None:
            composed += 1
            expected = canonical_json(recorded_output(envelope.event_type, body))
            if material != expected:
                assert envelope.event_type in ("tool.call", "retrieval"), envelope.event_type
                assert json.loads(material) == json.loads(expected)
                reordered += 1
    assert {e.event_type for e in recorder.events} >= {
        "tool.call",
        "random.draw",
        "clock.read",
        "state.transition",
    }
    assert composed >= 10
    assert reordered == 1  # the first tool's result: "é" sorts after "n"


def _raise() -> None:
    raise RuntimeError("tool failed")
