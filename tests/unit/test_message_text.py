"""What the full-text index takes of an ``llm.call`` body: the texts of the messages,
the system prompt and the answer, never roles, types, ids or tool definitions."""

from __future__ import annotations

import json
from typing import Any

from agent_blackbox.consumers import message_text_of


def _body(request: dict[str, Any], response: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "provider": "openai",
        "model": "m",
        "raw_request_json": json.dumps(request),
        "raw_response_json": None if response is None else json.dumps(response),
    }


def test_chat_messages_tool_calls_and_the_answer() -> None:
    request = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are the refund desk."},
            {"role": "user", "content": [{"type": "text", "text": "order 7731 please"}]},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"order": "7731"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_9", "content": "shipped yesterday"},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "secretdef"}}],
    }
    response = {
        "id": "r1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "It shipped yesterday."},
            }
        ],
    }
    text = message_text_of(_body(request, response))
    for said in (
        "refund desk",
        "order 7731 please",
        '"order": "7731"',
        "shipped yesterday",
        "It shipped yesterday.",
    ):
        assert said in text
    for noise in ("assistant", "call_9", "function", "secretdef", "gpt-4o-mini"):
        assert noise not in text


def test_anthropic_system_blocks_and_responses_input() -> None:
    anthropic = {
        "model": "claude",
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "where is my parcel"}],
    }
    assert message_text_of(_body(anthropic, None)).split("\n") == [
        "Be brief.",
        "where is my parcel",
    ]
    responses = {"model": "gpt-4.1", "instructions": "Answer in French.", "input": "bonjour"}
    assert message_text_of(_body(responses, None)) == "Answer in French.\nbonjour"


def test_a_body_that_is_not_json_gives_no_text() -> None:
    assert message_text_of({"raw_request_json": "{not json", "raw_response_json": None}) == ""
