"""Recorded LLM conversations as a chat dataset: each ``llm.call`` of a run in the format
OpenAI's fine-tuning and evaluation tools read (``{"messages": [...], "tools": [...]}``).

What the agent sent is the prompt (messages, tool calls, ``role: tool`` results, as they
were recorded, redaction placeholders included); the model's reply is the assistant
message that ends it. Chat Completions requests are in that format already; Responses
API requests (instructions and input items) are turned into the same messages, and a
request that continues a stored response (``previous_response_id``) gets that response's
conversation in front when the run recorded it. Anthropic Messages requests are turned
into the same messages too: the system prompt first, text blocks as text, ``tool_use``
blocks as function tool calls, ``tool_result`` blocks as ``role: tool`` messages, and
the tools' ``input_schema`` as function parameters; thinking blocks are left out (as a
Responses reasoning item is). A call with images or documents, or with a tool built into
the Anthropic API, has no chat form and is skipped as "not a chat".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from agent_blackbox.replayer._export import BodyOpener, ExportTally, timestamp
from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.schemas import Envelope, EventType, PayloadPipeline, completion_view

_MESSAGE_KEYS = ("role", "name", "content", "tool_calls", "tool_call_id")
"""What a message keeps: the fields of the chat format. What SDKs add besides (refusal,
annotations, audio, a null function_call) is left out."""
_CALL_KEYS = ("id", "type", "function", "custom")
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_TOOL_KEYS = ("name", "description", "parameters", "strict")


class _NotChat(Exception):
    """An LLM call that has no form in the chat format; the message says why."""


def chat_examples(
    events: Iterable[Envelope],
    pipeline: PayloadPipeline,
    *,
    blobs: BlobReader | None = None,
    per_call: bool = False,
    tally: ExportTally | None = None,
) -> Iterator[dict[str, Any]]:
    """The recorded LLM conversations as chat examples for fine-tuning or evaluation:
    ``{"messages": [...], "tools": [...], "metadata": {...}}`` (``tools`` only when the
    calls offered some).

    Each ``llm.call`` gives its request's messages (system, user, assistant turns with
    their tool calls, ``role: tool`` results, as the agent sent them) followed by the
    reply's first choice as an assistant message (its content and tool calls; a
    streamed reply assembled from its chunks). Redaction placeholders the recorder wrote
    stay as they are. ``metadata`` names the run, the call (``sequence``; ``sequences``:
    every call the example covers), model, provider, parameters, finish reason and the
    usage of the call that gave the last reply.

    By default a call is folded into a later call of its run that continues it (whose
    messages start with all of the earlier call's): a run gives one example per
    conversation, the whole of it, with the tools offered in any of its calls, and no
    assistant turn is written twice, as fine-tuning on whole conversations wants. With
    ``per_call`` every call is an example of its own: the prompt at that point and the
    reply the model gave, for evaluation.

    Calls whose body was truncated (over the blob ceiling), that failed, whose body
    cannot be opened or that have no chat form are skipped and counted in
    ``tally.skipped``.

    Args:
        events: one run's events in sequence order, or several runs one after another.
        pipeline: opens the bodies (with the audited keys of the replayer).
        blobs: reads bodies stored out of line.
        per_call: one example per LLM call instead of one per conversation.
        tally: counts what was written and what was skipped.

    Raises:
        ExportError: a body is sealed and ``pipeline`` has no keys.
    """
    tally = tally if tally is not None else ExportTally()
    bodies = BodyOpener(pipeline, blobs, tally)
    for _run_id, run in groupby(events, key=lambda e: e.run_id):
        tally.runs += 1
        calls = list(_run_calls(run, bodies, tally))
        examples = (c.example for c in calls) if per_call else _conversations(calls)
        for example in examples:
            tally.examples += 1
            yield example if example["tools"] else _without_tools(example)


@dataclass(frozen=True, slots=True)
class _Call:
    """One LLM call made into an example, with the running digests of its prompt (the
    k-th covers its first k messages), by which the calls it continues are found."""

    example: dict[str, Any]
    prefixes: tuple[bytes, ...]

    @property
    def sequence(self) -> int:
        return int(self.example["metadata"]["sequence"])

    @property
    def key(self) -> tuple[int, bytes]:
        return len(self.prefixes), self.prefixes[-1]


def _run_calls(run: Iterable[Envelope], bodies: BodyOpener, tally: ExportTally) -> Iterator[_Call]:
    """The examples of one run's LLM calls, in sequence order; the rest counted."""
    replies: dict[str, list[dict[str, Any]]] = {}  # response id → its whole conversation
    for envelope in run:
        tally.events += 1
        # Every event passes the guard; only LLM calls are opened.
        refused = bodies.refused(envelope) is not None
        if envelope.event_type != EventType.LLM_CALL:
            continue
        tally.llm_calls += 1
        if refused:
            tally.skipped["refused"] += 1
            continue
        body, _why = bodies.read(envelope)
        if body is None:
            tally.skipped["unreadable"] += 1
            continue
        if (reason := _skip_reason(envelope, body)) is not None:
            tally.skipped[reason] += 1
            continue
        try:
            call = _call(envelope, body, replies)
        except _NotChat as exc:
            tally.skipped["not a chat"] += 1
            tally.problem(f"run {envelope.run_id} sequence {envelope.sequence}: {exc}")
            continue
        if body.get("response_id"):
            replies[str(body["response_id"])] = call.example["messages"]
        yield call


def _skip_reason(envelope: Envelope, body: Mapping[str, Any]) -> str | None:
    if body.get("body_truncated") is not None or envelope.attributes.get("body_truncated"):
        return "truncated"
    if body.get("error") is not None or body.get("raw_response_json") is None:
        return "failed"
    return None


def _call(
    envelope: Envelope, body: Mapping[str, Any], replies: Mapping[str, list[dict[str, Any]]]
) -> _Call:
    """The example of one LLM call: its request's messages and the reply's first choice.

    Raises:
        _NotChat: the call has no form in the chat format (the message says why).
    """
    request, response = _json(body.get("raw_request_json")), _json(body.get("raw_response_json"))
    choices = completion_view(response).get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        # Read first: an embeddings request has an input too, and is no Responses call.
        raise _NotChat("the response has no reply (an embeddings or token count answer)")
    if body.get("provider") == "anthropic":
        api, messages = "anthropic.messages", _anthropic_messages(request)
        tools = _anthropic_tools(request)
    elif "messages" in request:
        api, messages, tools = "chat.completions", _chat_messages(request), _list(request, "tools")
    elif "input" in request:
        api, messages, tools = "responses", _responses_messages(request, replies), _tools(request)
    else:
        raise _NotChat("the request has neither messages nor input")
    reply = choices[0].get("message")
    if not isinstance(reply, Mapping):
        raise _NotChat("the reply has no message")
    metadata = {
        "run_id": envelope.run_id,
        "sequence": envelope.sequence,
        "sequences": [envelope.sequence],
        "event_id": envelope.event_id,
        "tenant_id": envelope.tenant_id,
        "agent_id": envelope.agent_id,
        "recorded_at": timestamp(envelope.recorded_at),
        "provider": body.get("provider"),
        "model": body.get("model"),
        "api": api,
        "streamed": request.get("stream") is True,
        "parameters": _parameters(body.get("request_params_json")),
        "response_id": body.get("response_id"),
        "finish_reason": body.get("finish_reason"),
        "usage": body.get("usage"),
        "latency_ms": body.get("latency_ms"),
    }
    whole = [*messages, _message({**reply, "role": "assistant"})]
    example = {"messages": whole, "tools": tools, "metadata": metadata}
    return _Call(example, _prefixes(messages))


def _json(text: Any) -> Mapping[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise _NotChat(f"its request or response is not JSON ({exc})") from None
    if not isinstance(value, Mapping):
        raise _NotChat("its request or response is not a JSON object")
    return value


def _list(request: Mapping[str, Any], name: str) -> list[Any]:
    value = request.get(name) or []
    if not isinstance(value, list):
        raise _NotChat(f"the request's {name} are not a list")
    return value


def _parameters(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _message(value: Any) -> dict[str, Any]:
    """A message with the fields of the chat format; ``content`` kept when null only
    where there are no tool calls (an assistant turn that only calls tools has none)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("role"), str):
        raise _NotChat("a message without a role")
    message = {k: value[k] for k in _MESSAGE_KEYS if value.get(k) is not None}
    calls = value.get("tool_calls")
    if calls:
        if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
            raise _NotChat("tool calls that are not a list of calls")
        message["tool_calls"] = [{k: c[k] for k in _CALL_KEYS if k in c} for c in calls]
    else:
        message.pop("tool_calls", None)
        message.setdefault("content", None)
    return message


def _chat_messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = _list(request, "messages")
    if not messages:
        raise _NotChat("the request has no messages")
    return [_message(m) for m in messages]


# The Responses API, turned into chat messages -----------------------------------------


def _responses_messages(
    request: Mapping[str, Any], replies: Mapping[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """A Responses API request's instructions, the conversation it continues and its
    input items, as chat messages."""
    messages: list[dict[str, Any]] = []
    previous = request.get("previous_response_id")
    if previous is not None:
        earlier = replies.get(str(previous))
        if earlier is None:
            raise _NotChat(f"it continues response {previous!r}, which this run did not record")
        # Instructions are not carried over from a previous response: this call's own
        # stand first (in place of the earlier call's).
        messages = [m for m in earlier if m["role"] != "system"]
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    items = request.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _NotChat("the request's input is neither text nor a list of items")
    for item in items:
        _add_item(messages, item)
    if not messages:
        raise _NotChat("the request has no input")
    return messages


def _add_item(messages: list[dict[str, Any]], item: Any) -> None:
    if not isinstance(item, Mapping):
        raise _NotChat("an input item that is not an object")
    kind = item.get("type", "message")
    if kind == "message":
        content = _text_content(item.get("content"))
        messages.append(_message({"role": item.get("role"), "content": content}))
    elif kind in ("function_call", "custom_tool_call"):
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            # One turn's text and each of its calls are items of their own. A new list:
            # the turn may be one of an earlier example's.
            messages[-1] = {
                **last,
                "tool_calls": [*last.get("tool_calls", ()), _responses_call(item)],
            }
        else:
            calls = [_responses_call(item)]
            messages.append({"role": "assistant", "tool_calls": calls})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        content = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
    elif kind != "reasoning":  # a reasoning summary is not part of the conversation
        raise _NotChat(f"an input item of type {kind!r}")


def _text_content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    kinds = [part.get("type") if isinstance(part, Mapping) else None for part in content]
    if not set(kinds) <= _TEXT_PARTS:
        raise _NotChat(f"content parts of types {sorted(set(map(str, kinds)))}")
    return "".join(str(part.get("text") or "") for part in content)


def _responses_call(item: Mapping[str, Any]) -> dict[str, Any]:
    if item.get("type") == "custom_tool_call":
        detail = {"name": item.get("name"), "input": item.get("input")}
        return {"id": item.get("call_id"), "type": "custom", "custom": detail}
    detail = {"name": item.get("name"), "arguments": item.get("arguments")}
    return {"id": item.get("call_id"), "type": "function", "function": detail}


def _tools(request: Mapping[str, Any]) -> list[Any]:
    """A Responses API request's function tools as chat tools; a built-in tool (web
    search, file search, ...) has no chat form."""
    chat = []
    for tool in _list(request, "tools"):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise _NotChat(f"a tool of type {kind!r} (built into the Responses API)")
        chat.append({"type": "function", "function": {k: tool[k] for k in _TOOL_KEYS if k in tool}})
    return chat


# Anthropic Messages, turned into chat messages ------------------------------------------


def _anthropic_messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic Messages request's system prompt and turns as chat messages."""
    messages: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        messages.append({"role": "system", "content": _anthropic_text(system)})
    for turn in _list(request, "messages"):
        if not isinstance(turn, Mapping) or turn.get("role") not in ("user", "assistant"):
            raise _NotChat("a message that is neither a user nor an assistant turn")
        content = turn.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise _NotChat("a message whose content is neither text nor a list of blocks")
        messages += _anthropic_turn(str(turn["role"]), blocks)
    if not messages:
        raise _NotChat("the request has no messages")
    return messages


def _anthropic_turn(role: str, blocks: list[Any]) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages: its tool results (each a ``role: tool``
    message, first, as they answer the calls before them), then its text and calls."""
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result":
            content = _anthropic_text(block.get("content") or "")
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content}
            )
        elif kind not in ("thinking", "redacted_thinking"):
            raise _NotChat(f"a content block of type {kind!r}")
    message: dict[str, Any] = {"role": role, "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return [*results, _message(message)] if texts or calls else results


def _anthropic_text(content: Any) -> str:
    """A system prompt or a tool result: text, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return str(_text_content(content))
    raise _NotChat("a system prompt or tool result that is neither text nor text blocks")


def _anthropic_tools(request: Mapping[str, Any]) -> list[Any]:
    """An Anthropic request's own tools as chat function tools; a tool built into the
    API (``web_search_…``, ``bash_…``, ...) has no chat form."""
    chat = []
    for tool in _list(request, "tools"):
        if not isinstance(tool, Mapping) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise _NotChat(f"a tool of type {kind!r} (built into the Anthropic API)")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        chat.append({"type": "function", "function": function})
    return chat


# Conversations -------------------------------------------------------------------------


def _prefixes(messages: list[dict[str, Any]]) -> tuple[bytes, ...]:
    running = hashlib.sha256()
    out = []
    for message in messages:
        text = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
        running.update(text.encode("utf-8", "surrogatepass") + b"\n")
        out.append(running.copy().digest())
    return tuple(out)


def _conversations(calls: list[_Call]) -> Iterator[dict[str, Any]]:
    """One example per conversation of a run: each call folded into every later call
    whose prompt starts with all of its own (its reply, as the agent kept it, and what
    came after); the example of a call no other call continues is written, covering the
    calls folded into it."""
    by_key: dict[tuple[int, bytes], list[_Call]] = {}
    for call in calls:
        by_key.setdefault(call.key, []).append(call)

    def folded(call: _Call) -> list[_Call]:
        found = (
            earlier
            for length in range(1, len(call.prefixes))
            for earlier in by_key.get((length, call.prefixes[length - 1]), ())
        )
        return sorted(found, key=lambda c: c.sequence)

    continued = {id(earlier) for call in calls for earlier in folded(call)}
    for call in calls:
        if id(call) in continued:
            continue
        covered = [*folded(call), call]
        metadata = {**call.example["metadata"], "sequences": [c.sequence for c in covered]}
        tools = _distinct([t for c in covered for t in c.example["tools"]])
        yield {**call.example, "tools": tools, "metadata": metadata}


def _distinct(tools: list[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for tool in tools:
        text = json.dumps(tool, sort_keys=True, default=str)
        if text not in seen:
            seen.add(text)
            out.append(tool)
    return out


def _without_tools(example: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in example.items() if k != "tools"}
