"""The ``llm.call`` boundary for OpenAI-compatible chat completion JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from outbox._boundaries import Crossing, error_info
from schemas import EventType, canonical_text

# Request fields that are the conversation or the call itself, not sampling parameters.
_NOT_PARAMS = frozenset({"messages", "tools", "model", "stream", "input", "tool_choice"})


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
    err = error_info(error)
    params = {k: v for k, v in request.items() if k not in _NOT_PARAMS}
    reply = response or {}
    choices = [_choice(c) for c in reply.get("choices") or []]
    tool_calls = [tc for c in reply.get("choices") or [] for tc in _tool_calls(c)]
    finish_reason = choices[0]["finish_reason"] if choices else None
    usage = _usage(reply.get("usage"))
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
        attributes.update({k: str(v) for k, v in usage.items()})
    if err:
        attributes["error"] = err["type"]
    outputs = {"response": None if response is None else dict(response), "error": err}
    return Crossing(
        EventType.LLM_CALL, body, llm_input(provider, model, request), outputs, attributes
    )


def _choice(choice: Mapping[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    content = message.get("content")
    return {
        "index": int(choice.get("index") or 0),
        "role": str(message.get("role") or "assistant"),
        "content": content if isinstance(content, str) else None,
        "finish_reason": _str_or_none(choice.get("finish_reason")),
    }


def _tool_calls(choice: Mapping[str, Any]) -> list[dict[str, str]]:
    calls = (choice.get("message") or {}).get("tool_calls") or []
    out = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        out.append(
            {
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "arguments_json": arguments
                if isinstance(arguments, str)
                else json.dumps(arguments),
            }
        )
    return out


def _usage(usage: Any) -> dict[str, int] | None:
    if not isinstance(usage, Mapping):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    total = int(usage.get("total_tokens") or prompt + completion)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
