"""The ``llm.call`` boundary for OpenAI-compatible chat completion JSON.

Bodies are written at :data:`schemas.LLM_CALL_VERSION`; the usage and tool call shapes
come from ``schemas`` so that v1 bodies migrated on read look like new ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outbox._boundaries import Crossing, error_info
from schemas import LLM_CALL_VERSION, EventType, canonical_text, llm_tool_call, llm_usage

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
