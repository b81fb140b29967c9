"""A local OpenAI-compatible HTTP server for the SDK capture tests.

It serves ``POST /v1/chat/completions`` and ``POST /v1/responses``, plain and streamed
(server-sent events, sent with chunked transfer encoding as the real API does), and
answers deterministically from the request alone, so a test knows every byte it will
get. Every request it receives is kept, headers included, so a test can prove what
went over the wire and that nothing did during a replay.

What it answers is chosen by the request:

- ``model`` ``"fail-<status>"`` (``fail-400``, ``fail-429``, ``fail-500``): an OpenAI
  error body with that HTTP status;
- ``tools`` present: a call of the first tool, or of every tool offered when the request
  sets ``parallel_tool_calls`` to true (one reply asking for several tools at once, also
  streamed). A tool's arguments are its declared parameters whose ``name=value`` words
  appear in the last user text, as if the model read them there; when none does, they
  are ``{"city": "Paris"}``;
- otherwise: the text ``"echo: <last user text>"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from typing import Any

from tests.integration._llm_server import LLMServer, Reply, pieces

CREATED = 1_700_000_000
TOOL_ARGUMENTS = '{"city": "Paris"}'
REQUEST_ID = "req_test_0001"


class OpenAIServer(LLMServer):
    """Serves the two endpoints on 127.0.0.1 on a free port, in a thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    name = "openai-test-server"
    base_path = "/v1"
    request_id_header = "x-request-id"
    request_id = REQUEST_ID

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        return answer(path, request)  # looked up per request: a test may replace it

    def kept(self, event: str | None, data: str) -> bool:
        return data != "[DONE]"


# Answers ---------------------------------------------------------------------------


def answer(path: str, request: Mapping[str, Any]) -> Reply:
    """The deterministic reply to ``request`` on ``path``."""
    model = str(request.get("model") or "")
    if model.startswith("fail-"):
        return _failure(int(model.removeprefix("fail-")))
    if path == "/v1/chat/completions":
        return chat_reply(request, _chat_message(request))
    if path == "/v1/responses":
        return responses_reply(request, _response_output(request))
    return Reply(
        HTTPStatus.NOT_FOUND,
        {"error": {"message": f"no route {path}", "type": "invalid_request_error"}},
    )


def _failure(status: int) -> Reply:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return Reply(
        status,
        {
            "error": {
                "message": f"the test server fails with {status}",
                "type": kind,
                "param": "model",
                "code": f"status_{status}",
            }
        },
    )


def _tool_name(request: Mapping[str, Any]) -> str | None:
    tools = request.get("tools") or []
    if not tools:
        return None
    tool = tools[0]
    return str((tool.get("function") or tool).get("name"))


def _last_user_text(request: Mapping[str, Any]) -> str:
    if "messages" in request:
        texts = [m.get("content") for m in request["messages"] if m.get("role") == "user"]
    else:
        given = request.get("input")
        texts = [given] if isinstance(given, str) else [m.get("content") for m in given or []]
    text = texts[-1] if texts else ""
    return text if isinstance(text, str) else json.dumps(text, sort_keys=True)


def _chat_usage() -> dict[str, Any]:
    return {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 2, "audio_tokens": 0},
    }


def _tool_calls(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool calls of the reply to ``request`` (none when it offers no tools)."""
    tools = request.get("tools") or []
    chosen = tools if request.get("parallel_tool_calls") is True else tools[:1]
    words = dict(word.split("=", 1) for word in _last_user_text(request).split() if "=" in word)
    calls = []
    for number, tool in enumerate(chosen, start=1):
        function = tool.get("function") or tool
        declared = (function.get("parameters") or {}).get("properties") or {}
        found = {name: words[name] for name in declared if name in words}
        arguments = json.dumps(found) if found else TOOL_ARGUMENTS
        calls.append(
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": str(function.get("name")), "arguments": arguments},
            }
        )
    return calls


def chat_reply(request: Mapping[str, Any], message: Mapping[str, Any]) -> Reply:
    """The Chat Completions answer to ``request`` saying ``message`` (an assistant message
    with its ``content`` or its ``tool_calls``), streamed when the request asks."""
    if request.get("stream"):
        return Reply(HTTPStatus.OK, events=tuple(_chat_events(request, message)))
    return Reply(HTTPStatus.OK, _chat_completion(request, message))


def _chat_message(request: Mapping[str, Any]) -> dict[str, Any]:
    calls = _tool_calls(request)
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if not calls:
        message["content"] = f"echo: {_last_user_text(request)}"
    else:
        message["tool_calls"] = calls
    return message


def _chat_completion(request: Mapping[str, Any], message: Mapping[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": CREATED,
        "model": request["model"],
        "system_fingerprint": "fp_test",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": _chat_usage(),
    }


def _chat_chunk(request: Mapping[str, Any], delta: Any, finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": request["model"],
        "system_fingerprint": "fp_test",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _chat_events(
    request: Mapping[str, Any], message: Mapping[str, Any]
) -> Iterator[tuple[str | None, str]]:
    calls = message.get("tool_calls")
    chunks = [_chat_chunk(request, {"role": "assistant", "content": ""}, None)]
    if not calls:
        chunks += [_chat_chunk(request, {"content": p}, None) for p in pieces(message["content"])]
        chunks.append(_chat_chunk(request, {}, "stop"))
    else:
        for index, call in enumerate(calls):
            whole = call["function"]["arguments"]
            function = {**call["function"], "arguments": ""}
            start = {"index": index, "id": call["id"], "type": "function", "function": function}
            chunks.append(_chat_chunk(request, {"tool_calls": [start]}, None))
            half = len(whole) // 2
            for part in (whole[:half], whole[half:]):
                fragment = {"index": index, "function": {"arguments": part}}
                chunks.append(_chat_chunk(request, {"tool_calls": [fragment]}, None))
        chunks.append(_chat_chunk(request, {}, "tool_calls"))
    if (request.get("stream_options") or {}).get("include_usage"):
        final = _chat_chunk(request, {}, None)
        final["choices"] = []
        final["usage"] = _chat_usage()
        chunks.append(final)
    for chunk in chunks:
        yield None, json.dumps(chunk)
    yield None, "[DONE]"


def _response_usage() -> dict[str, Any]:
    return {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 26,
    }


def _response_output(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    tool = _tool_name(request)
    if tool is not None:
        return [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": tool,
                "arguments": TOOL_ARGUMENTS,
                "status": "completed",
            }
        ]
    return [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [
                {
                    "type": "output_text",
                    "text": f"echo: {_last_user_text(request)}",
                    "annotations": [],
                }
            ],
        }
    ]


def responses_reply(request: Mapping[str, Any], output: list[dict[str, Any]]) -> Reply:
    """The Responses API answer to ``request`` whose output is ``output`` (its first item a
    ``message`` or a ``function_call``), streamed when the request asks."""
    if request.get("stream"):
        return Reply(HTTPStatus.OK, events=tuple(_response_events(request, output)))
    return Reply(HTTPStatus.OK, _response(request, output))


def _response(
    request: Mapping[str, Any], output: list[dict[str, Any]], *, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "model": request["model"],
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": list(request.get("tools") or []),
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "usage": _response_usage() if status == "completed" else None,
    }


def _response_events(
    request: Mapping[str, Any], output: list[dict[str, Any]]
) -> Iterator[tuple[str | None, str]]:
    item = output[0]
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response(request, [], status="in_progress")},
    ]
    if item["type"] == "message":
        text = item["content"][0]["text"]
        added = {**item, "status": "in_progress", "content": []}
        events.append({"type": "response.output_item.added", "output_index": 0, "item": added})
        for piece in pieces(text):
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
            )
        events.append(
            {
                "type": "response.output_text.done",
                "item_id": item["id"],
                "output_index": 0,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            }
        )
    else:
        added = {**item, "status": "in_progress", "arguments": ""}
        events.append({"type": "response.output_item.added", "output_index": 0, "item": added})
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item["id"],
                "output_index": 0,
                "delta": item["arguments"],
            }
        )
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append({"type": "response.completed", "response": _response(request, output)})
    for number, event in enumerate(events):
        event["sequence_number"] = number
        yield event["type"], json.dumps(event)
