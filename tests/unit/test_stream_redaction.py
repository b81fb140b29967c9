"""A value split over the chunks of a streamed reply is redacted: each channel's text is
redacted as a whole, then dealt back into the same chunks."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.outbox._stream_redaction import redacted_stream
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import EventType, PayloadPipeline

MAIL = "jane.doe@example.com"
TEXT = f"Sure: write to {MAIL} and I will answer."


def _cut(text: str, size: int = 5) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def chat_stream(text: str) -> dict[str, Any]:
    arguments = json.dumps({"to": MAIL, "subject": "hello"})
    chunks: list[dict[str, Any]] = [
        {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    ]
    chunks += [{"id": "c", "choices": [{"index": 0, "delta": {"content": p}}]} for p in _cut(text)]
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "mail"}}
    chunks.append({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    chunks += [
        {
            "id": "c",
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}
            ],
        }
        for p in _cut(arguments, 4)
    ]
    chunks.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return {"stream": chunks}


def anthropic_stream(text: str) -> dict[str, Any]:
    start = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {}}
    return {
        "stream": [
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            *(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": p},
                }
                for p in _cut(text, 3)
            ),
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
            {"type": "message_stop"},
        ]
    }


def responses_stream(text: str) -> dict[str, Any]:
    return {
        "stream": [
            {"type": "response.output_text.delta", "item_id": "m1", "output_index": 0,
             "content_index": 0, "delta": p}
            for p in _cut(text, 7)
        ]
    }  # fmt: skip


def _text(response: Any) -> str:
    """The answer's text, put together from the stream's pieces."""
    out = []
    for chunk in response["stream"]:
        delta = chunk.get("delta")
        if isinstance(delta, str):
            out.append(delta)
        elif isinstance(delta, dict) and "text" in delta:
            out.append(delta["text"])
        for choice in chunk.get("choices", []):
            out.append(choice["delta"].get("content") or "")
    return "".join(out)


def _no_fragment(value: Any) -> None:
    """No two adjacent pieces of the address survive anywhere in ``value``."""
    flat = json.dumps(value)
    for fragment in ("jane.", "doe@", "@exam", "example.c"):
        assert fragment not in flat, fragment


@pytest.mark.parametrize("stream", [chat_stream, anthropic_stream, responses_stream])
def test_an_address_split_over_chunks_is_recorded_redacted(stream: Any) -> None:
    sent = stream(TEXT)
    before = copy.deepcopy(sent)

    def agent(run: AgentRun, _: Any) -> Any:
        answer = run.llm(lambda _r: sent, {"model": "m", "stream": True}, provider="p")
        return _text(answer)

    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot(code_version="c1"), agent_id="a")
    assert sent == before  # the agent's objects are left as they were
    [call] = [e for e in recorder.events if e.event_type == EventType.LLM_CALL]
    assert "email" in call.attributes["redacted"]
    body = PayloadPipeline().unpack(call)
    recorded = json.loads(body["raw_response_json"])
    _no_fragment(recorded)
    assert len(recorded["stream"]) == len(sent["stream"])  # the same chunks, redacted
    assert _text(recorded) == "Sure: write to [redacted:email] and I will answer."
    assert replay_run(recorder.events, agent).passed


def test_tool_call_arguments_split_over_chunks_are_redacted_as_one_text() -> None:
    redacted = redacted_stream(chat_stream("nothing to see here"), _fake_redact)
    pieces = [
        call["function"].get("arguments", "")
        for chunk in redacted["stream"]
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls", [])
    ]
    assert json.loads("".join(pieces)) == {"to": "[mail]", "subject": "hello"}


def test_a_stream_without_a_match_is_given_back_as_it_was() -> None:
    sent = chat_stream("nothing to see here")
    stream = {"stream": [c for c in sent["stream"] if "tool_calls" not in str(c)]}
    assert redacted_stream(stream, _fake_redact) is stream
    assert redacted_stream({"id": "x"}, _fake_redact) == {"id": "x"}


def _fake_redact(text: str) -> str:
    return text.replace(MAIL, "[mail]")
