"""The ``llm.call`` boundary for OpenAI-compatible chat completion JSON.

Bodies are written at :data:`agent_blackbox.schemas.LLM_CALL_VERSION`; the usage and
tool call shapes come from ``schemas`` so that v1 bodies migrated on read look like new
ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_blackbox.outbox._boundaries import Crossing, error_info, plain_error
from agent_blackbox.schemas import (
    LLM_CALL_VERSION,
    EventType,
    canonical_text,
    llm_tool_call,
    llm_usage,
)

# Request fields that are the conversation or the call itself, not sampling parameters.
_NOT_PARAMS = frozenset(
    {"messages", "tools", "model", "stream", "input", "instructions", "tool_choice"}
)


def llm_input(provider: str, model: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The digested input of an LLM call."""
    return {"provider": provider, "model": model, "request": dict(request)}


def llm_call(
    *,
    provider: str,
    model: str,
    request: Mapping[str, Any],
    response: Mapping[str, Any] | None,
    error: BaseException | None,
    latency_ms: float,
) -> Crossing:
    """A finished LLM call; ``response`` is the provider's raw JSON."""
    err = plain_error(error_info(error))  # llm.call v2 records type and message only
    params = {k: v for k, v in request.items() if k not in _NOT_PARAMS}
    reply = completion_view(response or {})
    choices = [_choice(c) for c in reply.get("choices") or []]
    tool_calls = [tc for c in reply.get("choices") or [] for tc in _tool_calls(c)]
    finish_reason = choices[0]["finish_reason"] if choices else None
    usage = llm_usage(reply.get("usage"))
    body = {
        "provider": provider,
        "model": model,
        "request_params_json": canonical_text(params, path="llm.params"),
        "raw_request_json": canonical_text(dict(request), path="llm.request"),
        "raw_response_json": None
        if response is None
        else canonical_text(dict(response), path="llm.response"),
        "response_id": _str_or_none(reply.get("id")),
        "choices": choices,
        "tool_calls": tool_calls,
        "finish_reason": finish_reason,
        "usage": usage,
        "latency_ms": latency_ms,
        "error": err,
    }
    attributes = {"provider": provider, "model": model, "latency_ms": f"{latency_ms:.3f}"}
    if finish_reason:
        attributes["finish_reason"] = finish_reason
    if usage:
        # Attribute names stay those of v1: views and analytics index on them.
        attributes.update(
            prompt_tokens=str(usage["input_tokens"]),
            completion_tokens=str(usage["output_tokens"]),
            cached_tokens=str(usage["cached_tokens"]),
            total_tokens=str(usage["total_tokens"]),
        )
    if err:
        attributes["error"] = err["type"]
    outputs = {"response": None if response is None else dict(response), "error": err}
    return Crossing(
        EventType.LLM_CALL,
        body,
        llm_input(provider, model, request),
        outputs,
        attributes,
        version=LLM_CALL_VERSION,
    )


def completion_view(response: Mapping[str, Any]) -> Mapping[str, Any]:
    """The chat-completion shape of ``response``, from which the body's summary fields
    (choices, tool calls, finish reason, usage, id) are read.

    A Responses API body (``"object": "response"``) and a recorded stream
    (``{"stream": [chunk, ...]}``, of chat completion chunks or of Responses events)
    are folded into that shape; any other body is its own view. The raw response is
    recorded as it came either way.
    """
    stream = response.get("stream")
    if isinstance(stream, list):
        events = [e for e in stream if isinstance(e, Mapping)]
        if any(str(e.get("type", "")).startswith("response.") for e in events):
            return _from_response_events(events)
        return _from_chunks(events)
    if response.get("object") == "response":
        return _from_response(response)
    return response


def _from_response(response: Mapping[str, Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            texts += [p.get("text") or "" for p in item.get("content") or [] if "text" in p]
        elif kind == "function_call":
            detail = {"name": item.get("name"), "arguments": item.get("arguments")}
            calls.append({"id": item.get("call_id"), "type": "function", "function": detail})
        elif kind == "custom_tool_call":
            detail = {"name": item.get("name"), "input": item.get("input")}
            calls.append({"id": item.get("call_id"), "type": "custom", "custom": detail})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    finish = _response_finish(response, has_calls=bool(calls))
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return {"id": response.get("id"), "choices": [choice], "usage": response.get("usage")}


def _response_finish(response: Mapping[str, Any], *, has_calls: bool) -> str | None:
    """The status of a Responses API body named as Chat Completions name a finish, so
    analytics group both APIs alike."""
    status = response.get("status")
    if status == "completed":
        return "tool_calls" if has_calls else "stop"
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "length" if reason == "max_output_tokens" else _str_or_none(reason)
    return _str_or_none(status)


def _from_response_events(events: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    # The last event that carries the whole response has the final state of the call.
    finals = [e["response"] for e in events if isinstance(e.get("response"), Mapping)]
    return _from_response(finals[-1]) if finals else {}


def _from_chunks(chunks: list[Mapping[str, Any]]) -> dict[str, Any]:
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for part in chunk.get("choices") or []:
            index = int(part.get("index") or 0)
            choice = choices.setdefault(
                index, {"index": index, "message": {"role": "assistant"}, "finish_reason": None}
            )
            _merge_delta(choice["message"], part.get("delta") or {})
            choice["finish_reason"] = part.get("finish_reason") or choice["finish_reason"]
    first = chunks[0] if chunks else {}
    ordered = [choices[i] for i in sorted(choices)]
    return {"id": first.get("id"), "choices": ordered, "usage": usage}


def _merge_delta(message: dict[str, Any], delta: Mapping[str, Any]) -> None:
    if delta.get("role"):
        message["role"] = delta["role"]
    if isinstance(delta.get("content"), str):
        message["content"] = (message.get("content") or "") + delta["content"]
    for fragment in delta.get("tool_calls") or []:
        calls = message.setdefault("tool_calls", [])
        position = int(fragment.get("index") or 0)
        while len(calls) <= position:
            calls.append(
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
        call, function = calls[position], fragment.get("function") or {}
        call["id"] = fragment.get("id") or call["id"]
        call["type"] = fragment.get("type") or call["type"]
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""


def _choice(choice: Mapping[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    content = message.get("content")
    return {
        "index": int(choice.get("index") or 0),
        "role": str(message.get("role") or "assistant"),
        "content": content if isinstance(content, str) else None,
        "finish_reason": _str_or_none(choice.get("finish_reason")),
    }


def _tool_calls(choice: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = (choice.get("message") or {}).get("tool_calls") or []
    out = []
    for call in calls:
        kind = str(call.get("type") or "function")
        # Custom tools carry their text under "custom" rather than "function".
        detail = call.get(kind) or call.get("function") or {}
        arguments = detail.get("arguments", detail.get("input"))
        out.append(
            llm_tool_call(
                call_id=str(call.get("id") or ""),
                name=str(detail.get("name") or ""),
                arguments=arguments,
                kind=kind,
            )
        )
    return out


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
