"""LLM bodies: stored once, out of line up to the ceiling, truncated (not refused) past it."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from agent_blackbox.outbox import MemoryRecorder, PayloadTooLarge, RunSnapshot
from agent_blackbox.outbox._boundaries import recorded, recorded_output, tool_call
from agent_blackbox.outbox._llm import llm_call, truncated_llm_call
from agent_blackbox.outbox._writer import Cursor, EventFactory, RunIdentity
from agent_blackbox.replayer import DivergenceKind, reexecute, replay_run
from agent_blackbox.replayer._timeline import timeline_table
from agent_blackbox.schemas import (
    EnvelopeCodec,
    EventType,
    PayloadPipeline,
    Settings,
    canonical_text,
    completion_view,
    digest,
    digest_bytes,
    llm_reply,
)
from tests.integration._agents import LARGE_REPLY_QUESTION, large_reply, large_reply_agent

CEILING = 100_000
# Uncompressed: the large replies here are repetitive text that zstd would fit under the
# ceiling, and these tests are about bodies over it.
SMALL = Settings(blob_threshold_bytes=1_000, max_blob_bytes=CEILING, payload_compression="none")
REQUEST = {"model": "m-large", "messages": [{"role": "user", "content": "hi"}]}


def _factory(settings: Settings) -> EventFactory:
    return EventFactory(
        settings=settings,
        pipeline=PayloadPipeline(),
        codec=EnvelopeCodec(),
        clock=lambda: datetime(2026, 12, 3, tzinfo=UTC),
    )


def _call(response: dict[str, Any], request: dict[str, Any] = REQUEST) -> Any:
    return llm_call(
        provider="test", model="m-large", request=request, response=response, error=None,
        latency_ms=1.0,
    )  # fmt: skip


def test_an_llm_call_over_the_ceiling_is_recorded_truncated_with_the_whole_calls_digests() -> None:
    response = large_reply(500_000)
    crossing = _call(response)
    identity = RunIdentity(run_id="r", tenant_id="t", agent_id="a", shard=0)
    prepared = _factory(SMALL).prepare(identity, Cursor(), crossing, event_id="e1")
    envelope = prepared.envelope
    # The digests are those of the whole call: the request as the agent made it, the
    # response as the model sent it.
    assert envelope.input_digest == digest(crossing.input)
    assert envelope.output_digest == digest({"response": response, "error": None})
    assert envelope.attributes["body_truncated"] == "true"
    assert envelope.attributes["total_tokens"] == "9000012"  # the summary views index on
    assert prepared.blob is not None  # over the inline limit: in the blob store
    assert len(prepared.blob[1]) <= CEILING
    body = PayloadPipeline().unpack(envelope, prepared.blob[1])
    truncated = body["body_truncated"]
    whole = canonical_text(response)
    assert truncated["body_bytes"] > CEILING
    assert truncated["ceiling_bytes"] == CEILING
    assert truncated["response_bytes"] == len(whole)
    assert truncated["response_sha256"] == digest_bytes(whole.encode())
    assert truncated["request_sha256"] == digest_bytes(canonical_text(REQUEST).encode())
    assert json.loads(body["raw_request_json"]) == REQUEST  # small: kept for re-execution
    assert body["raw_response_json"] is None
    assert (body["finish_reason"], body["response_id"]) == ("tool_calls", "chatcmpl-large")
    assert body["usage"]["output_tokens"] == 9_000_000
    # The reduced response keeps the reply's shape, its tool call whole, its text cut.
    reply = llm_reply(body)
    assert reply.truncated
    assert [(c["name"], c["arguments_json"]) for c in reply.tool_calls] == [
        ("weather", '{"city":"Paris"}')
    ]
    content = reply.choices[0]["content"]
    assert content.startswith(response["choices"][0]["message"]["content"][:100])
    assert len(content) < 5_000


def test_a_body_kept_whole_reads_its_view_from_the_raw_response() -> None:
    body = _call(large_reply(10)).body
    assert body["body_truncated"] is None
    reply = llm_reply(body)
    assert not reply.truncated
    assert reply.choices[0]["content"] == large_reply(10)["choices"][0]["message"]["content"]
    assert len(reply.choices[0]["content"]) == len("Summary: ") + 10
    assert reply.finish_reason == "tool_calls"


def test_a_large_request_is_left_out_and_the_response_kept_and_checked() -> None:
    request = {**REQUEST, "messages": [{"role": "user", "content": "q" * 200_000}]}
    response = large_reply(100)
    crossing = _call(response, request)
    body = truncated_llm_call(crossing, body_bytes=200_500, ceiling=CEILING)
    assert body.body["raw_request_json"] is None
    assert body.body["body_truncated"]["request_bytes"] > 200_000
    assert json.loads(body.body["raw_response_json"]) == response
    assert (body.input, body.output) == (crossing.input, crossing.output)
    # The response is whole, so replay still checks it against the output digest.
    assert digest(recorded_output(EventType.LLM_CALL, body.body)) == digest(crossing.output)


def test_a_stream_over_the_ceiling_keeps_its_tool_calls_and_drops_its_text_chunks() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        part = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [part]}

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather"}}
    arguments = {"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}
    stream = [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": "word "}) for _ in range(20_000)),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [arguments]}),
        chunk({}, "tool_calls"),
    ]
    response = {"stream": stream}
    crossing = _call(response)
    truncated = truncated_llm_call(crossing, body_bytes=1_500_000, ceiling=CEILING)
    kept = json.loads(truncated.body["body_truncated"]["reduced_response_json"])
    assert len(kept["stream"]) == 5  # the first text chunk stays, the other 19,999 go
    view = completion_view(kept)
    message = view["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city":"Oslo"}',
    }
    assert view["choices"][0]["finish_reason"] == "tool_calls"


def test_a_truncated_reply_replays_its_control_flow_and_says_what_it_could_not_check() -> None:
    recorder = MemoryRecorder(settings=Settings(max_blob_bytes=CEILING, payload_compression="none"))
    entry = large_reply_agent(large_reply(500_000))
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    _, output = recorder.record(entry, snapshot, agent_id="large")
    assert output == {"starts": "Summary: ", "tool": "sunny in Paris"}
    report = replay_run(recorder.events, entry, blobs=recorder)
    assert report.passed, report.divergence and report.divergence.describe()
    assert report.result == "LIMITED"
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "limited"}
    (note,) = report.notes
    assert "sequence 2 (llm.call) was recorded truncated" in note
    assert f"over the ceiling of {CEILING}" in note
    assert report.limited is not None
    assert "sequence 2" in report.limited
    assert report.to_dict()["notes"] == [note]


def test_changed_code_after_a_truncated_reply_still_diverges() -> None:
    recorder = MemoryRecorder(settings=Settings(max_blob_bytes=CEILING, payload_compression="none"))
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    recorder.record(large_reply_agent(large_reply(500_000)), snapshot, agent_id="large")

    def changed(run: Any, question: Any) -> Any:
        request = {"model": "m-large", "messages": [{"role": "user", "content": question}]}
        answer = run.llm(lambda _: {}, request, provider="test", model="m-large")
        call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        city = json.loads(call["arguments"])["city"].upper()  # the change
        return run.call(call["name"], lambda city: city, city=city)

    report = replay_run(recorder.events, changed, blobs=recorder)
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.sequence) == (
        DivergenceKind.ARGUMENT_MISMATCH,
        3,
    )
    assert len(report.notes) == 1  # the truncated reply before it is still named


def test_another_body_over_the_ceiling_is_refused() -> None:
    identity = RunIdentity(run_id="r", tenant_id="t", agent_id="a", shard=0)
    huge = tool_call(tool="t", args=(), kwargs={}, result="x" * 200_000, error=None, latency_ms=1)
    with pytest.raises(PayloadTooLarge, match="BLACKBOX_MAX_BLOB_BYTES"):
        _factory(SMALL).prepare(identity, Cursor(), huge, event_id="e1")


def test_the_ceiling_is_read_from_its_variable_and_from_its_former_name() -> None:
    assert Settings().max_blob_bytes == 256 * 1024 * 1024
    assert Settings.from_env({"BLACKBOX_MAX_BLOB_BYTES": "5000"}).max_blob_bytes == 5000
    assert Settings.from_env({"BLACKBOX_MAX_PAYLOAD_BYTES": "7000"}).max_blob_bytes == 7000
    both = {"BLACKBOX_MAX_PAYLOAD_BYTES": "7000", "BLACKBOX_MAX_BLOB_BYTES": "5000"}
    assert Settings.from_env(both).max_blob_bytes == 5000


def test_reexecute_does_not_resend_a_call_recorded_truncated() -> None:
    recorder = MemoryRecorder(settings=Settings(max_blob_bytes=CEILING, payload_compression="none"))
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    recorder.record(large_reply_agent(large_reply(500_000)), snapshot, agent_id="large")
    sent: list[Any] = []

    def send(request: Any) -> dict[str, Any]:
        sent.append(request)
        return {}

    (diff,) = reexecute(recorder.events, send)
    assert sent == []
    assert diff.sequence == 2
    assert diff.error is not None
    assert "recorded truncated" in diff.error


def test_the_timeline_shows_an_llm_calls_derived_answer_first() -> None:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    run, _ = recorder.record(large_reply_agent(large_reply(20)), snapshot, agent_id="large")
    out = io.StringIO()
    table = timeline_table(run.run_id, recorder.events, pipeline=PayloadPipeline())
    Console(file=out, color_system=None, width=2000).print(table)
    row = next(line for line in out.getvalue().splitlines() if "llm.call" in line)
    text = large_reply(20)["choices"][0]["message"]["content"]
    assert f'{{"choices": [{{"index": 0, "role": "assistant", "content": "{text}' in row


def test_a_responses_stream_over_the_ceiling_keeps_its_function_call() -> None:
    text = "word " * 30_000
    call = {
        "type": "function_call",
        "call_id": "call_9",
        "name": "weather",
        "arguments": '{"city":"Rome"}',
    }
    message = {"type": "message", "content": [{"type": "output_text", "text": text}]}
    final = {"id": "resp_9", "object": "response", "status": "completed", "output": [message, call]}
    stream = [
        *({"type": "response.output_text.delta", "delta": "word "} for _ in range(30_000)),
        {"type": "response.completed", "response": final},
    ]
    crossing = _call({"stream": stream})
    truncated = truncated_llm_call(crossing, body_bytes=2_000_000, ceiling=CEILING)
    reply = llm_reply(truncated.body)
    assert [(c["id"], c["name"], c["arguments_json"]) for c in reply.tool_calls] == [
        ("call_9", "weather", '{"city":"Rome"}')
    ]
    assert reply.finish_reason == "tool_calls"
    assert reply.choices[0]["content"].startswith("word word")


def test_an_anthropic_stream_over_the_ceiling_keeps_its_tool_use() -> None:
    start = {"id": "msg_9", "type": "message", "role": "assistant", "content": [], "usage": {}}
    tool = {"type": "tool_use", "id": "toolu_9", "name": "weather", "input": {}}
    stream = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "w "},
            }
            for _ in range(40_000)
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": tool},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"city":"Rome"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}},
        {"type": "message_stop"},
    ]
    crossing = _call({"stream": stream})
    truncated = truncated_llm_call(crossing, body_bytes=3_000_000, ceiling=CEILING)
    reduced = json.loads(truncated.body["body_truncated"]["reduced_response_json"])
    assert len(reduced["stream"]) == 9  # the text deltas after the first are dropped
    reply = llm_reply(truncated.body)
    assert [(c["name"], c["arguments_json"]) for c in reply.tool_calls] == [
        ("weather", '{"city":"Rome"}')
    ]
    assert reply.finish_reason == "tool_calls"


def test_state_and_output_taken_from_a_reduced_text_are_not_counted_as_divergences() -> None:
    reply = large_reply(500_000)

    def entry(run: Any, question: Any) -> Any:
        request = {"model": "m-large", "messages": [{"role": "user", "content": question}]}
        answer = run.llm(lambda _: reply, request, provider="test", model="m-large")
        text = answer["choices"][0]["message"]["content"]
        run.transition("summarised", state={"length": len(text)})  # differs once cut
        return {"length": len(text)}

    recorder = MemoryRecorder(settings=Settings(max_blob_bytes=CEILING, payload_compression="none"))
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    recorder.record(entry, snapshot, agent_id="large")
    report = replay_run(recorder.events, entry, blobs=recorder)
    assert report.passed, report.divergence and report.divergence.describe()
    assert report.result == "LIMITED"
    assert report.levels == {"control_flow": "pass", "state": "limited", "content": "limited"}
    assert [n.split(" not counted")[0] for n in report.notes[1:]] == [
        "state_mismatch at sequence 3",
        "output_mismatch at sequence 4",
    ]


@pytest.mark.parametrize(
    ("reply", "composed"),
    [
        ({"choices": [{"message": {"content": "Paris"}}], "usage": {"total_tokens": 7}}, True),
        # Written otherwise by RFC 8785 ("1", "1e-7"): the composed text's digest does
        # not match, and the value itself is digested.
        ({"choices": [], "temperature": 1.0, "logprob": 1e-7}, False),
    ],
)
def test_a_replayed_reply_is_checked_from_its_text_where_it_is_canonical(
    reply: dict[str, Any], composed: bool
) -> None:
    def entry(run: Any, question: Any) -> Any:
        request = {"model": "m", "messages": [{"role": "user", "content": question}]}
        return run.llm(lambda _: reply, request, provider="test", model="m")

    recorder = MemoryRecorder()
    recorder.record(entry, RunSnapshot(code_version="v1", input="capital?"), agent_id="a")
    [call] = [e for e in recorder.events if e.event_type == EventType.LLM_CALL]
    output, material = recorded(call.event_type, PayloadPipeline().unpack(call))
    assert material is not None
    assert (digest_bytes(material) == call.output_digest) is composed
    assert output["response"] == reply
    report = replay_run(recorder.events, entry, blobs=recorder)
    assert report.passed, report.divergence and report.divergence.describe()
