"""The parsed view of an LLM reply, derived from the raw response when it is read.

An ``llm.call`` body (v3) stores the provider's response once, as raw JSON. Everything
parsed from it (choices, tool calls) is derived here, by the one function that also
gives the recorder its summary fields, so a view derived today says what the recorder
saw. A Responses API body, an Anthropic message and a recorded stream of either
provider are folded into the chat-completion shape first (:func:`completion_view`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_blackbox.schemas._llm_call import anthropic_usage, llm_tool_call

ANTHROPIC_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
"""Anthropic's ``stop_reason`` → the finish reason Chat Completions gives for the same
end, so that analytics group both providers alike; any other (``pause_turn``) is kept
as Anthropic names it. The raw response keeps the original."""

_ANTHROPIC_EVENTS = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    }
)


@dataclass(frozen=True, slots=True)
class LlmReply:
    """The parsed view of one ``llm.call``: what v1 and v2 bodies stored as fields.

    ``choices`` are ``{index, role, content, finish_reason}``; ``tool_calls`` are
    ``{id, type, name, arguments_json, arguments_raw}`` (see :func:`llm_tool_call`),
    those of every choice in order.
    """

    choices: tuple[dict[str, Any], ...]
    tool_calls: tuple[dict[str, Any], ...]
    response_id: str | None
    finish_reason: str | None
    truncated: bool
    """The body was over the blob ceiling: the view comes from its reduced response,
    whose texts may be cut short."""


def llm_reply(body: Mapping[str, Any]) -> LlmReply:
    """The parsed view of an ``llm.call`` body read at v3 (the newest version).

    Derived from ``raw_response_json``, or, in a truncated body, from the reduced
    response it kept. A body without a response (a failed call) has an empty view.
    """
    truncated = body.get("body_truncated")
    text = body.get("raw_response_json")
    if text is None and truncated is not None:
        text = truncated.get("reduced_response_json")
    response = json.loads(text) if isinstance(text, str) else None
    reply = completion_view(response) if isinstance(response, Mapping) else {}
    choices = reply.get("choices") or []
    parsed = tuple(choice_view(c) for c in choices)
    return LlmReply(
        choices=parsed,
        tool_calls=tuple(call for c in choices for call in tool_call_views(c)),
        response_id=_str_or_none(reply.get("id")),
        finish_reason=parsed[0]["finish_reason"] if parsed else None,
        truncated=truncated is not None,
    )


def completion_view(response: Mapping[str, Any]) -> Mapping[str, Any]:
    """The chat-completion shape of ``response``, from which the summary fields
    (choices, tool calls, finish reason, usage, id) are read.

    A Responses API body (``"object": "response"``), an Anthropic message (``"type":
    "message"``) and a recorded stream (``{"stream": [chunk, ...]}``, of chat completion
    chunks, Responses events or Anthropic Messages events) are folded into that shape;
    any other body is its own view. The raw response is recorded as it came either way.

    An Anthropic message becomes one choice: its text blocks joined as the content, its
    ``tool_use`` blocks as function tool calls (arguments as JSON text), its stop reason
    named as in :data:`ANTHROPIC_FINISH_REASONS`, its usage as :func:`anthropic_usage`
    counts it. Thinking blocks and the server's own tool use (``server_tool_use``, run
    by the provider, not by the agent) are not part of the view.
    """
    stream = response.get("stream")
    if isinstance(stream, list):
        events = [e for e in stream if isinstance(e, Mapping)]
        if any(str(e.get("type", "")).startswith("response.") for e in events):
            return _from_response_events(events)
        if any(e.get("type") in _ANTHROPIC_EVENTS for e in events):
            return _from_message(_message_of_events(events))
        return _from_chunks(events)
    if response.get("object") == "response":
        return _from_response(response)
    if response.get("type") == "message":
        return _from_message(response)
    return response


def choice_view(choice: Mapping[str, Any]) -> dict[str, Any]:
    """One choice of a chat-completion shaped reply as ``{index, role, content,
    finish_reason}``."""
    message = choice.get("message") or {}
    content = message.get("content")
    return {
        "index": int(choice.get("index") or 0),
        "role": str(message.get("role") or "assistant"),
        "content": content if isinstance(content, str) else None,
        "finish_reason": _str_or_none(choice.get("finish_reason")),
    }


def tool_call_views(choice: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool calls of one choice, each as :func:`llm_tool_call` writes it."""
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


def _from_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic message as a one-choice chat completion."""
    blocks = [b for b in message.get("content") or [] if isinstance(b, Mapping)]
    texts = [str(b.get("text") or "") for b in blocks if b.get("type") == "text"]
    calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": _json_text(block.get("input"))},
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {
        "role": str(message.get("role") or "assistant"),
        "content": "".join(texts) if texts else None,
    }
    if calls:
        reply["tool_calls"] = calls
    stop = message.get("stop_reason")
    finish = ANTHROPIC_FINISH_REASONS.get(stop, stop) if isinstance(stop, str) else None
    usage = message.get("usage")
    return {
        "id": message.get("id"),
        "model": message.get("model"),
        "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
        "usage": anthropic_usage(usage) if isinstance(usage, Mapping) else None,
    }


def _json_text(arguments: Any) -> Any:
    """A tool's input as the text of its JSON: a streamed input is already the text the
    model sent (kept as sent, also when it is not JSON)."""
    if arguments is None or isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def _message_of_events(events: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The Anthropic message a recorded stream of Messages events makes.

    ``message_start`` carries the message without content and its input usage; each
    content block starts, grows by its deltas (text, or the tool input's JSON text in
    pieces) and stops; ``message_delta`` gives the stop reason and the usage so far,
    whose counts replace the ones before (an absent or null count keeps its value).
    """
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            message = dict(event["message"])
            message["usage"] = dict(message.get("usage") or {})
        elif kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            blocks[_index(event)] = dict(event["content_block"])
        elif kind == "content_block_delta":
            _add_delta(blocks.setdefault(_index(event), {}), inputs, event)
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            message.update({k: delta[k] for k in ("stop_reason", "stop_sequence") if k in delta})
            counts = event.get("usage") or {}
            usage = message.setdefault("usage", {})
            usage.update({k: v for k, v in counts.items() if v is not None})
    for index, text in inputs.items():
        if text:  # no piece at all leaves the input the block started with
            blocks[index]["input"] = text
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _add_delta(block: dict[str, Any], inputs: dict[int, str], event: Mapping[str, Any]) -> None:
    delta = event.get("delta") or {}
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
    elif kind == "input_json_delta":
        index = _index(event)
        inputs[index] = inputs.get(index, "") + str(delta.get("partial_json") or "")


def _index(event: Mapping[str, Any]) -> int:
    index = event.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


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


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
