"""A local Anthropic-compatible HTTP server for the SDK capture tests.

It serves ``POST /v1/messages``, plain and streamed (server-sent events with their
``event:`` names, sent with chunked transfer encoding as the real API does: the Messages
API sequence ``message_start``, ``ping``, ``content_block_start``,
``content_block_delta`` (``text_delta`` and ``input_json_delta``),
``content_block_stop``, ``message_delta``, ``message_stop``), and answers
deterministically from the request alone, so a test knows every byte it will get.
Every request it receives is kept, headers included, so a test can prove what went over
the wire and that nothing did during a replay.

What it answers is chosen by the request:

- ``model`` ``"fail-<status>"`` (``fail-400``, ``fail-429``, ``fail-529``): an Anthropic
  error body (``{"type": "error", "error": {"type", "message"}}``) with that HTTP status;
- ``model`` ``"fail-midstream"`` with ``stream``: a stream that starts, then sends an
  ``error`` event (overloaded);
- ``tools`` present (and the last user turn not a tool result): a short text block,
  then a ``tool_use`` block calling the first tool, stop reason ``tool_use``. Its input
  is the tool's declared properties whose ``name=value`` words appear in the last user
  text, as if the model read them there; when none does, ``{"city": "Paris"}``;
- otherwise: one text block ``"echo: <last user text>"``, stop reason ``end_turn``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from typing import Any

from tests.integration._llm_server import LLMServer, Reply, pieces

TOOL_INPUT = {"city": "Paris"}
REQUEST_ID = "req_anthropic_test_0001"
PREFACE = "Let me look that up."
USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 3,
    "cache_read_input_tokens": 8,
    "output_tokens": 5,
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class AnthropicServer(LLMServer):
    """Serves the Messages API on 127.0.0.1 on a free port, in a thread; the SDK's base
    URL is the bare address (it appends ``/v1/messages``).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. What it sent back
    (:attr:`sent`) leaves out the ``ping`` events of a stream.
    """

    name = "anthropic-test-server"
    request_id_header = "request-id"
    request_id = REQUEST_ID

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        return answer(path, request)  # looked up per request: a test may replace it

    def kept(self, event: str | None, data: str) -> bool:
        return event != "ping"


# Answers ---------------------------------------------------------------------------


def answer(path: str, request: Mapping[str, Any]) -> Reply:
    """The deterministic reply to ``request`` on ``path``."""
    if path != "/v1/messages":
        return _failure(HTTPStatus.NOT_FOUND, f"no route {path}")
    model = str(request.get("model") or "")
    streamed = bool(request.get("stream"))
    if model == "fail-midstream" and streamed:
        return Reply(HTTPStatus.OK, events=tuple(_failing_events(request)))
    if model.startswith("fail-"):
        status = int(model.removeprefix("fail-"))
        return _failure(status, f"the test server fails with {status}")
    message = message_for(request)
    if streamed:
        return Reply(HTTPStatus.OK, events=tuple(events_for(request, message)))
    return Reply(HTTPStatus.OK, message)


def _failure(status: int, text: str) -> Reply:
    kind = _ERROR_TYPES.get(status, "api_error")
    error = {"type": "error", "error": {"type": kind, "message": text}, "request_id": REQUEST_ID}
    return Reply(status, error)


def last_user_text(request: Mapping[str, Any]) -> str:
    """The text of the last user turn (a tool result counts as its content)."""
    texts = [m.get("content") for m in request.get("messages") or [] if m.get("role") == "user"]
    content = texts[-1] if texts else ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(str(block.get("text")))
        elif block.get("type") == "tool_result":
            parts.append(f"tool_result:{block.get('content')}")
    return " ".join(parts)


def _tool_input(request: Mapping[str, Any], tool: Mapping[str, Any]) -> dict[str, Any]:
    words = dict(word.split("=", 1) for word in last_user_text(request).split() if "=" in word)
    declared = (tool.get("input_schema") or {}).get("properties") or {}
    found = {name: words[name] for name in declared if name in words}
    return found or dict(TOOL_INPUT)


def message_for(request: Mapping[str, Any]) -> dict[str, Any]:
    """The whole message the server answers ``request`` with."""
    tools = request.get("tools") or []
    if tools and not last_user_text(request).startswith("tool_result:"):
        content: list[dict[str, Any]] = [
            {"type": "text", "text": PREFACE},
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": str(tools[0]["name"]),
                "input": _tool_input(request, tools[0]),
            },
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": f"echo: {last_user_text(request)}"}]
        stop = "end_turn"
    return message(request, content, stop)


def message(request: Mapping[str, Any], content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    """The assistant message answering ``request`` with the ``content`` blocks, stopped
    for the reason ``stop``."""
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": dict(USAGE),
    }


def _start(message: Mapping[str, Any]) -> dict[str, Any]:
    usage = {**USAGE, "output_tokens": 1}
    started = {**message, "content": [], "stop_reason": None, "usage": usage}
    return {"type": "message_start", "message": started}


def events_for(
    request: Mapping[str, Any], message: Mapping[str, Any]
) -> Iterator[tuple[str | None, str]]:
    """The server-sent events of ``message``, streamed."""
    events: list[dict[str, Any]] = [_start(message), {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            for piece in pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                }
            )
            whole = json.dumps(block["input"])
            half = len(whole) // 2
            for part in (whole[:half], whole[half:]):
                delta = {"type": "input_json_delta", "partial_json": part}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": USAGE["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    for event in events:
        yield event["type"], json.dumps(event)


def _failing_events(request: Mapping[str, Any]) -> Iterator[tuple[str | None, str]]:
    message = message_for({**request, "tools": []})
    yield "message_start", json.dumps(_start(message))
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    yield "error", json.dumps(error)
