"""Model servers that work through a tool loop one step at a time, as a model asked to
use every tool before it answers would: the OpenAI-compatible one (Chat Completions and
Responses) and the Anthropic-compatible one, plain and streamed.

Each turn is decided by the request alone (so a replay's recorded answers are what the
server would say again):

1. the first offered function tool the conversation has not called yet is called, with
   ``{"city": <city>}``;
2. once every one was, an offered output tool (a name starting ``final_result``, as
   pydantic-ai names it) is called with the structured answer;
3. otherwise, when the request asks for JSON output (Anthropic's ``output_config`` or
   OpenAI's ``response_format``/``text.format``), the structured answer is the text;
4. otherwise the text is ``"answer: <the last tool result>"``.

The structured answer fills each property of the requested schema: ``city`` with the
city, any other with the last tool result. The city is the ``city=<name>`` word of the
first user text (``Paris`` when it has none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from tests.integration import _anthropic_server as anthropic_server
from tests.integration import _openai_server as openai_server
from tests.integration._llm_server import Reply
from tests.integration.frameworks._model import (
    AgentAnthropicServer,
    AgentOpenAIServer,
    tool_result_of,
)

__all__ = ["LoopAnthropicServer", "LoopOpenAIServer", "first_user_text", "next_turn"]

OUTPUT_TOOL_PREFIX = "final_result"
DEFAULT_CITY = "Paris"


@dataclass(frozen=True)
class Call:
    """A turn that calls a tool."""

    name: str
    arguments: dict[str, Any]
    number: int
    """The call's number in the conversation (its id)."""


@dataclass(frozen=True)
class Text:
    """A turn that answers with text."""

    text: str


Turn = Call | Text


# Reading a conversation of any of the three APIs ----------------------------------------


def _plain(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _items(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conversation: Chat or Anthropic messages, or Responses input items."""
    found = request.get("messages", request.get("input"))
    if isinstance(found, str):
        return [{"role": "user", "content": found}]
    return [item for item in found or [] if isinstance(item, dict)]


def _called(request: Mapping[str, Any]) -> list[str]:
    """The names of the tools the conversation called, in order."""
    names: list[str] = []
    for item in _items(request):
        if item.get("type") == "function_call":
            names.append(str(item.get("name")))
        for call in item.get("tool_calls") or []:
            names.append(str(call["function"]["name"]))
        content = item.get("content")
        if item.get("role") == "assistant" and isinstance(content, list):
            names += [str(b.get("name")) for b in content if b.get("type") == "tool_use"]
    return names


def first_user_text(request: Mapping[str, Any]) -> str:
    """The text of the conversation's first user turn, in any of the three APIs."""
    users = [_plain(item.get("content")) for item in _items(request) if item.get("role") == "user"]
    return users[0] if users else ""


def _city(request: Mapping[str, Any]) -> str:
    words = dict(w.split("=", 1) for w in first_user_text(request).split() if "=" in w)
    return words.get("city", DEFAULT_CITY)


def _tool_schema(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    function = tool.get("function") or tool
    schema = function.get("parameters") or function.get("input_schema") or {}
    return str(function.get("name")), schema


def _json_format(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the request asks the text to follow, or None."""
    for found in (
        (request.get("output_config") or {}).get("format"),
        request.get("response_format"),
        (request.get("text") or {}).get("format"),
    ):
        if isinstance(found, dict) and found.get("type") == "json_schema":
            schema = found.get("schema") or (found.get("json_schema") or {}).get("schema")
            return schema if isinstance(schema, dict) else {}
    return None


def _structured(schema: Mapping[str, Any], city: str, result: str) -> dict[str, Any]:
    names = (schema.get("properties") or {}).keys()
    return {name: city if name == "city" else result for name in names}


def next_turn(request: Mapping[str, Any]) -> Turn:
    """What the model does next (see the module)."""
    called = _called(request)
    city = _city(request)
    result = tool_result_of(request) or ""
    offered = [_tool_schema(tool) for tool in request.get("tools") or []]
    functions = [name for name, _ in offered if not name.startswith(OUTPUT_TOOL_PREFIX)]
    outputs = [(name, s) for name, s in offered if name.startswith(OUTPUT_TOOL_PREFIX)]
    number = len(called) + 1
    for name in functions:
        if name not in called:
            return Call(name, {"city": city}, number)
    if outputs:
        name, schema = outputs[0]
        return Call(name, _structured(schema, city, result), number)
    asked = _json_format(request)
    if asked is not None:
        return Text(json.dumps(_structured(asked, city, result)))
    return Text(f"answer: {result}")


# OpenAI Chat Completions and Responses ---------------------------------------------------


def _chat_message(turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if isinstance(turn, Text):
        message["content"] = turn.text
    else:
        function = {"name": turn.name, "arguments": json.dumps(turn.arguments)}
        message["tool_calls"] = [
            {"id": f"call_{turn.number}", "type": "function", "function": function}
        ]
    return message


def _response_item(turn: Turn) -> dict[str, Any]:
    if isinstance(turn, Call):
        return {
            "type": "function_call",
            "id": f"fc_{turn.number}",
            "call_id": f"call_{turn.number}",
            "name": turn.name,
            "arguments": json.dumps(turn.arguments),
            "status": "completed",
        }
    text = {"type": "output_text", "text": turn.text, "annotations": []}
    return {
        "type": "message",
        "id": "msg_loop",
        "role": "assistant",
        "status": "completed",
        "content": [text],
    }


class LoopOpenAIServer(AgentOpenAIServer):
    """The OpenAI-compatible server working through the tool loop (see the module);
    requests without tools are answered as :class:`AgentOpenAIServer` does."""

    name = "loop-openai-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        if not request.get("tools") or str(request.get("model", "")).startswith("fail-"):
            return super().reply(path, request)
        if path == "/v1/chat/completions":
            return openai_server.chat_reply(request, _chat_message(next_turn(request)))
        if path == "/v1/responses":
            return openai_server.responses_reply(request, [_response_item(next_turn(request))])
        return super().reply(path, request)


# Anthropic Messages -----------------------------------------------------------------------


def _anthropic_message(request: Mapping[str, Any], turn: Turn) -> dict[str, Any]:
    if isinstance(turn, Text):
        return anthropic_server.message(request, [{"type": "text", "text": turn.text}], "end_turn")
    block = {
        "type": "tool_use",
        "id": f"toolu_{turn.number:02d}",
        "name": turn.name,
        "input": turn.arguments,
    }
    return anthropic_server.message(request, [block], "tool_use")


class LoopAnthropicServer(AgentAnthropicServer):
    """The Anthropic-compatible server working through the tool loop (see the module)."""

    name = "loop-anthropic-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        model = str(request.get("model", ""))
        asks = request.get("tools") or _json_format(request) is not None
        if path != "/v1/messages" or model.startswith("fail-") or not asks:
            return super().reply(path, request)
        message = _anthropic_message(request, next_turn(request))
        if not request.get("stream"):
            return Reply(HTTPStatus.OK, message)
        return Reply(HTTPStatus.OK, events=tuple(anthropic_server.events_for(request, message)))
