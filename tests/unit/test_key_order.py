"""What replay hands back has its dicts' keys in the order they were recorded in, so code
that writes them out (``json.dumps(result)`` in its next request) replays; digests stay
those of canonical JSON, and runs stored with sorted keys replay as they always did."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, AsyncMemoryRecorder, MemoryRecorder, RunSnapshot
from agent_blackbox.outbox._llm import llm_call, truncated_llm_call
from agent_blackbox.replayer import DivergenceKind, ReplayRun, read_archive, replay_run
from agent_blackbox.schemas import (
    Envelope,
    EventType,
    PayloadContext,
    PayloadPipeline,
    canonical_json,
    canonical_text,
    digest,
    digest_bytes,
    ordered_text,
)
from tests.golden.record_key_order import (
    SORTED_RUN,
    UNSORTED_INPUT,
    UNSORTED_RUN,
    KeyOrderAgent,
    held_still,
    record_runs,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "key-order.sorted-text.avro"


def _order(value: Any) -> str:
    """``value`` as ``json.dumps`` writes it: in its own key order."""
    return json.dumps(value)


def _recorded(agent: Any, input: Any) -> list[Envelope]:
    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot("order.1", input=input), agent_id="order")
    return recorder.events


def _golden() -> dict[str, list[Envelope]]:
    return {run: list(events) for run, events in groupby(read_archive(GOLDEN), lambda e: e.run_id)}


# The bug: json.dumps of a tool result --------------------------------------------------


def quoting_agent(run: AgentRun, input: Any) -> Any:
    result = run.call("lookup", lambda: {"zeta": 1, "alpha": 2})
    request = {"messages": [{"role": "tool", "content": json.dumps(result)}]}
    response = run.llm(lambda request: {"id": "r", "choices": []}, request, provider="openai")
    return response["id"]


def test_an_agent_that_quotes_a_tool_result_with_json_dumps_replays() -> None:
    report = replay_run(_recorded(quoting_agent, None), quoting_agent)
    assert report.passed, report.divergence and report.divergence.describe()


def test_every_value_replay_hands_back_comes_back_in_its_recorded_key_order() -> None:
    recorded: list[Any] = []
    events = _recorded(KeyOrderAgent(sort_keys=False, seen=recorded), UNSORTED_INPUT)
    replayed: list[Any] = []
    report = replay_run(events, KeyOrderAgent(sort_keys=False, seen=replayed))
    assert report.passed, report.divergence and report.divergence.describe()
    # The run input, the tool's result, the hits, the effect's result, the LLM response.
    assert _order(replayed) == _order(recorded)
    assert list(replayed[0]["result"]) == ["zeta", "alpha", "nested"]
    assert list(replayed[0]["response"]) == ["id", "model", "choices"]
    assert list(ReplayRun(events).input) == list(UNSORTED_INPUT)


def test_async_replay_hands_values_back_in_their_recorded_key_order() -> None:
    async def agent(run: Any, input: Any) -> Any:
        result = await run.call("lookup", lambda: {"zeta": 1, "alpha": 2})
        request = {"messages": [json.dumps(input), json.dumps(result)]}
        response = await run.llm(lambda r: {"id": "r", "b": 1, "a": 2}, request, provider="x")
        return list(response)

    recorder = AsyncMemoryRecorder()
    snapshot = RunSnapshot("order.1", input={"zeta": 1, "alpha": 2})
    _, output = asyncio.run(recorder.record(agent, snapshot, agent_id="order"))
    assert output == ["id", "b", "a"]
    report = replay_run(recorder.events, agent)
    assert report.passed, report.divergence and report.divergence.describe()


# Storage: ordered text, canonical digests -----------------------------------------------


def test_bodies_store_handed_back_values_in_their_own_order_and_the_rest_canonical() -> None:
    events = _recorded(KeyOrderAgent(sort_keys=False), UNSORTED_INPUT)
    pipeline = PayloadPipeline()
    bodies = {e.event_type: pipeline.unpack(e) for e in events}
    value = UNSORTED_INPUT
    assert bodies[EventType.RUN_STARTED]["input_json"] == ordered_text(value)
    assert bodies[EventType.TOOL_CALL]["result_json"] == ordered_text(value["result"])
    assert bodies[EventType.RETRIEVAL]["hits_json"] == ordered_text(value["hits"])
    assert bodies[EventType.EFFECT_RECEIPT]["result_json"] == ordered_text(value["receipt"])
    assert bodies[EventType.LLM_CALL]["raw_response_json"] == ordered_text(value["response"])
    # Inputs and what the code produced are never handed back: canonical as before.
    request = json.loads(bodies[EventType.LLM_CALL]["raw_request_json"])
    assert bodies[EventType.LLM_CALL]["raw_request_json"] == canonical_text(request)
    state = bodies[EventType.STATE_TRANSITION]["state_json"]
    assert state == canonical_text(json.loads(state))
    # The output digest is the canonical JSON's, as it always was.
    tool = next(e for e in events if e.event_type == EventType.TOOL_CALL)
    assert tool.output_digest == digest({"result": value["result"], "error": None})


def test_recording_again_gives_the_digests_and_chain_of_the_release_that_sorted_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    golden = _golden()
    with held_still(monkeypatch):
        again = {run: list(e) for run, e in groupby(record_runs(), lambda e: e.run_id)}
    # Values whose keys were already sorted: the same envelopes, byte for byte.
    assert again[SORTED_RUN] == golden[SORTED_RUN]
    # The same values in another order: the same digests; only the stored text (and so
    # the payload's hash in the chain) differs, where a mapping's order does.
    unsorted, before = again[UNSORTED_RUN], golden[UNSORTED_RUN]
    assert [(e.input_digest, e.output_digest) for e in unsorted] == [
        (e.input_digest, e.output_digest) for e in before
    ]
    stored = {
        e.event_type for e, old in zip(unsorted, before, strict=True) if e.payload != old.payload
    }
    assert stored == {
        EventType.RUN_STARTED,
        EventType.TOOL_CALL,
        EventType.RETRIEVAL,
        EventType.EFFECT_RECEIPT,
        EventType.LLM_CALL,
    }
    assert [replace(e, payload=None, chain_hash="") for e in unsorted] == [
        replace(e, payload=None, chain_hash="") for e in before
    ]


def test_a_truncated_llm_body_keeps_its_reduced_response_in_order() -> None:
    response = {
        "id": "r",
        "choices": [{"message": {"role": "assistant", "content": "x" * 300_000}}],
    }
    whole = llm_call(
        provider="p", model="m", request={}, response=response, error=None, latency_ms=0.0
    )
    body = truncated_llm_call(whole, body_bytes=400_000, ceiling=200_000).body
    reduced = json.loads(body["body_truncated"]["reduced_response_json"])
    assert _order(reduced).startswith('{"id": "r", "choices": [{"message": {"role": ')
    # What it left out is still named by the SHA-256 of its canonical JSON.
    assert body["body_truncated"]["response_sha256"] == digest_bytes(canonical_json(response))


# Bodies stored with sorted keys ---------------------------------------------------------


@pytest.mark.parametrize("run_id", [SORTED_RUN, UNSORTED_RUN])
def test_a_run_stored_with_sorted_keys_replays_and_hands_back_what_it_stored(
    run_id: str,
) -> None:
    replayed: list[Any] = []
    report = replay_run(_golden()[run_id], KeyOrderAgent(sort_keys=True, seen=replayed))
    assert report.passed, report.divergence and report.divergence.describe()
    [seen] = replayed
    for value in seen.values():  # as stored: sorted
        assert _order(value) == json.dumps(value, sort_keys=True)


# Tampering is still found ----------------------------------------------------------------


def _with_text(envelope: Envelope, field: str, text: str) -> Envelope:
    """``envelope`` with ``text`` in its body's ``field``, the chain left as it was."""
    pipeline = PayloadPipeline()
    body = {**pipeline.unpack(envelope), field: text}
    context = PayloadContext(envelope.run_id, envelope.sequence, envelope.event_id, "default")
    packed = pipeline.pack(envelope.event_type, envelope.body_version, body, context)
    return replace(envelope, payload=packed.data, payload_encoding=packed.encoding)


_FIELDS: dict[str, str] = {EventType.TOOL_CALL: "result_json", EventType.RETRIEVAL: "hits_json"}


def _rewritten(kind: str, rewrite: Any) -> tuple[list[Envelope], int]:
    events = _recorded(KeyOrderAgent(sort_keys=False), UNSORTED_INPUT)
    at = next(i for i, e in enumerate(events) if e.event_type == kind)
    text = PayloadPipeline().unpack(events[at])[_FIELDS[kind]]
    events[at] = _with_text(events[at], _FIELDS[kind], rewrite(text))
    return events, at + 1


@pytest.mark.parametrize("kind", list(_FIELDS))
def test_an_ordered_text_rewritten_to_another_value_is_a_tampered_output(kind: str) -> None:
    events, sequence = _rewritten(kind, lambda t: t.replace("2", "3").replace("0.9", "0.8"))
    report = replay_run(events, KeyOrderAgent(sort_keys=False))
    assert (DivergenceKind.TAMPERED_OUTPUT, sequence) in [
        (d.kind, d.sequence) for d in report.divergences
    ]


@pytest.mark.parametrize("kind", list(_FIELDS))
def test_an_ordered_text_rewritten_sorted_is_the_same_output_in_a_broken_chain(kind: str) -> None:
    events, sequence = _rewritten(kind, lambda t: canonical_text(json.loads(t)))
    report = replay_run(events, KeyOrderAgent(sort_keys=False))
    found = [(d.kind, d.sequence) for d in report.divergences]
    assert (DivergenceKind.BROKEN_CHAIN, sequence) in found  # the payload is not the one chained
    assert DivergenceKind.TAMPERED_OUTPUT not in {kind for kind, _ in found}


@pytest.mark.parametrize(
    ("kind", "field", "text"),
    [
        (EventType.TOOL_CALL, "result_json", '{"zeta":NaN,"alpha":2}'),
        (EventType.TOOL_CALL, "result_json", "[" * 150 + "]" * 150),
        (EventType.LLM_CALL, "raw_response_json", '{"id":"r","choices":[],"x":Infinity}'),
    ],
)
def test_a_text_canonical_json_refuses_is_a_tampered_output(
    kind: str, field: str, text: str
) -> None:
    # Not canonical, so replay digests the value, which has no digest: the recorder
    # digested every output it wrote, so this one is not the recorded one.
    events = _recorded(quoting_agent, None)
    at = next(i for i, e in enumerate(events) if e.event_type == kind)
    events[at] = _with_text(events[at], field, text)
    report = replay_run(events, quoting_agent)
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.sequence) == (
        DivergenceKind.TAMPERED_OUTPUT,
        at + 1,
    )
