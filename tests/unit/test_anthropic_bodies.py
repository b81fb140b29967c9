"""Anthropic Messages API JSON read by the schemas' views: usage, stop reasons, tool use,
recorded streams; and the ``llm.call`` body the recorder writes from them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_blackbox.outbox._llm import llm_call
from agent_blackbox.replayer._fork_diff import llm_summary
from agent_blackbox.schemas import (
    anthropic_usage,
    completion_view,
    declared_tool_schemas,
    llm_reply,
    llm_usage,
)

USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 3,
    "cache_read_input_tokens": 8,
    "output_tokens": 5,
}
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
REQUEST = {
    "model": "claude-test",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "weather in Paris?"}],
    "tools": [TOOL],
}


def message(*content: dict[str, Any], stop: str | None = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content),
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": dict(USAGE),
    }


TEXT = {"type": "text", "text": "Let me look."}
TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}


def _delta(index: int, **delta: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def streamed(*, partial: list[str], output_tokens: int = 5) -> dict[str, Any]:
    start = message(stop=None)
    start["usage"] = {**USAGE, "output_tokens": 1}
    text_start = {"type": "text", "text": ""}
    return {
        "stream": [
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0, "content_block": text_start},
            _delta(0, type="text_delta", text="Let "),
            _delta(0, type="text_delta", text="me look."),
            {"type": "content_block_stop", "index": 0},
            {"type": "content_block_start", "index": 1, "content_block": {**TOOL_USE, "input": {}}},
            *(_delta(1, type="input_json_delta", partial_json=p) for p in partial),
            {"type": "content_block_stop", "index": 1},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens, "cache_read_input_tokens": None},
            },
            {"type": "message_stop"},
        ]
    }


def _body(response: dict[str, Any], request: dict[str, Any] = REQUEST) -> Any:
    return llm_call(
        provider="anthropic",
        model="claude-test",
        request=request,
        response=response,
        error=None,
        latency_ms=2.0,
    )


def test_usage_counts_the_whole_input_and_the_cache_read_as_cached() -> None:
    assert anthropic_usage(USAGE) == {
        "prompt_tokens": 23,
        "completion_tokens": 5,
        "total_tokens": 28,
        "prompt_tokens_details": {"cached_tokens": 8, "cache_creation_tokens": 3},
    }
    assert llm_usage(USAGE) == {
        "input_tokens": 23,
        "output_tokens": 5,
        "cached_tokens": 8,
        "total_tokens": 28,
    }
    # OpenAI's counts read as before.
    openai = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    assert llm_usage(openai) == {
        "input_tokens": 10,
        "output_tokens": 2,
        "cached_tokens": 0,
        "total_tokens": 12,
    }


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
        (None, None),
    ],
)
def test_a_stop_reason_is_named_as_a_finish_reason(stop: str | None, finish: str | None) -> None:
    view = completion_view(message(TEXT, stop=stop))
    assert view["choices"][0]["finish_reason"] == finish


def test_a_message_is_one_choice_with_its_text_and_tool_use() -> None:
    view = completion_view(message(TEXT, TOOL_USE, {"type": "thinking", "thinking": "hm"}))
    (choice,) = view["choices"]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "toolu_01",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert view["id"] == "msg_01"


def test_a_recorded_stream_folds_into_the_same_view_as_the_message() -> None:
    whole = completion_view(message(TEXT, TOOL_USE, stop="tool_use"))
    folded = completion_view(streamed(partial=['{"city": ', '"Paris"}']))
    assert llm_summary(folded) == llm_summary(whole)
    assert folded["usage"] == whole["usage"]  # message_start's input, message_delta's output
    assert folded["choices"][0]["message"]["content"] == "Let me look."


def test_a_streamed_tool_input_without_pieces_keeps_the_input_it_started_with() -> None:
    view = completion_view(streamed(partial=[]))
    call = view["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == "{}"


def test_the_body_carries_finish_reason_usage_and_tool_calls() -> None:
    crossing = _body(message(TEXT, TOOL_USE, stop="tool_use"))
    body = crossing.body
    assert body["finish_reason"] == "tool_calls"
    assert body["response_id"] == "msg_01"
    assert body["usage"] == {
        "input_tokens": 23,
        "output_tokens": 5,
        "cached_tokens": 8,
        "total_tokens": 28,
    }
    assert crossing.attributes["tool_calls_requested"] == "1"
    assert crossing.attributes["provider"] == "anthropic"
    assert json.loads(body["request_params_json"]) == {"max_tokens": 100}
    reply = llm_reply(body)
    assert reply.finish_reason == "tool_calls"
    assert [(c["id"], c["name"], c["arguments_json"]) for c in reply.tool_calls] == [
        ("toolu_01", "get_weather", '{"city":"Paris"}')
    ]
    assert reply.choices[0]["content"] == "Let me look."


def test_a_streamed_body_reads_like_the_plain_one() -> None:
    crossing = _body(streamed(partial=['{"city":', ' "Paris"}']), {**REQUEST, "stream": True})
    assert crossing.attributes["streamed"] == "true"
    assert crossing.body["finish_reason"] == "tool_calls"
    assert crossing.body["usage"]["total_tokens"] == 28
    assert llm_reply(crossing.body).tool_calls[0]["arguments_json"] == '{"city":"Paris"}'


def test_a_stream_cut_short_reads_what_it_has() -> None:
    events = streamed(partial=['{"city": "Par'])["stream"][:7]
    view = completion_view({"stream": events})
    call = view["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"city": "Par'  # kept as sent
    assert view["choices"][0]["finish_reason"] is None
    assert llm_reply(_body({"stream": events}).body).tool_calls[0]["arguments_raw"] == (
        '{"city": "Par'
    )


def test_declared_tool_schemas_reads_chat_and_anthropic_tools() -> None:
    chat = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    schemas = declared_tool_schemas([chat, TOOL, server_tool, "junk"])
    assert schemas == {"f": {"type": "object"}, "get_weather": TOOL["input_schema"]}
    assert declared_tool_schemas(None) == {}
