"""A run's LLM calls as a conversation: each recorded request and answer turned into chat
turns for the run page, whatever provider API shape it was recorded in.

Three request shapes are read: OpenAI Chat Completions (``messages``), OpenAI Responses
(``instructions`` and ``input`` items) and Anthropic Messages (``system`` and
``messages`` of content blocks); a legacy completion's ``prompt`` is shown as the user's
text. The answer is read once, from the recorded response through
:func:`~agent_blackbox.schemas.completion_view` (the function the recorder takes its
summary fields from), so a streamed answer (``{"stream": [event, ...]}``) is shown
assembled, as the agent's SDK assembled it. Tool calls keep their arguments, and a tool
result is shown beside the name of the call it answers. A text that is JSON (an object
or an array) is shown pretty-printed; anything a turn holds that is not text (an image,
a file, a block this module does not know) is shown as a short note or as its JSON.

Nothing here escapes: the templates do (autoescaped, hidden characters made visible),
so a turn holds the recorded text as it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent_blackbox.schemas import completion_view

MEDIA_URL_CHARS = 80
"""The longest image or file URL shown whole; a longer one (a data URL) is summarised."""


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of a turn: ``text`` as recorded, ``json`` (a JSON text pretty-printed),
    ``thinking`` (a model's reasoning) or ``note`` (what stands for something not text:
    an image, a file, a reference)."""

    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the model asked for, with its arguments (pretty-printed when JSON)."""

    call_id: str
    name: str
    arguments: Part


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a conversation.

    ``role`` is ``system``, ``developer``, ``user``, ``assistant`` or ``tool`` (a tool's
    result, sent back to the model: ``answers`` is the id of the call it answers,
    ``tool`` that call's name, ``error`` whether it was sent as an error). ``label``
    says more where a role alone does not (``instructions``, ``choice 2``).
    """

    role: str
    parts: tuple[Part, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    answers: str = ""
    tool: str = ""
    error: bool = False
    label: str = ""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One ``llm.call`` as chat turns: what was sent (``turns``, the first ``folded`` of
    which are the conversation of call ``folded_from`` again) and what came back."""

    sequence: int
    provider: str
    model: str
    api: str
    """``chat completions``, ``responses``, ``messages`` or ``completions``; empty when
    the request is of no shape read here (its raw JSON is still shown)."""
    turns: tuple[Turn, ...]
    answer: tuple[Turn, ...]
    error: str | None
    streamed: int | None
    """The number of streamed events the answer was assembled from (None: not streamed)."""
    raw_request: str
    raw_response: str
    notes: tuple[str, ...] = ()
    folded: int = 0
    folded_from: int | None = None

    @property
    def kind(self) -> str:
        return "llm"


@dataclass(frozen=True, slots=True)
class ToolRun:
    """One recorded ``tool.call``: the tool, its arguments, and its result or error."""

    sequence: int
    tool: str
    arguments: Part
    result: Part | None
    error: str | None
    latency_ms: float | None

    @property
    def kind(self) -> str:
        return "tool"


@dataclass(frozen=True, slots=True)
class Withheld:
    """A body that was not shown, and why."""

    sequence: int
    event_type: str
    reason: str

    @property
    def kind(self) -> str:
        return "withheld"


Item = Exchange | ToolRun | Withheld


@dataclass(frozen=True, slots=True)
class Opened:
    """One body as the conversation takes it: the event's sequence and type, and its
    readable body (:func:`agent_blackbox.replayer.readable_body`) or why there is none."""

    sequence: int
    event_type: str
    body: Mapping[str, Any] | None
    withheld: str | None = None


def conversation(opened: Iterable[Opened]) -> list[Item]:
    """The items of a run's conversation in sequence order: an :class:`Exchange` per LLM
    call, a :class:`ToolRun` per tool call, a :class:`Withheld` per body not shown.

    Where a call resends the conversation so far (as agents do), the turns it shares
    with the previous call and that call's answer are folded (``Exchange.folded``).
    """
    items: list[Item] = []
    previous: Exchange | None = None
    for entry in sorted(opened, key=lambda o: o.sequence):
        if entry.body is None:
            items.append(Withheld(entry.sequence, entry.event_type, entry.withheld or "not shown"))
        elif entry.event_type == "llm.call":
            made = _folded(exchange(entry.sequence, entry.body), previous)
            items.append(made)
            previous = made
        elif entry.event_type == "tool.call":
            items.append(tool_run(entry.sequence, entry.body))
    return items


def exchange(sequence: int, body: Mapping[str, Any]) -> Exchange:
    """The chat turns of one ``llm.call`` body, as :func:`readable_body` gives it (its
    ``raw_request`` and ``raw_response`` parsed)."""
    provider = str(body.get("provider") or "")
    request = body.get("raw_request")
    truncated = body.get("body_truncated")
    response = body.get("raw_response")
    notes: list[str] = []
    if response is None and isinstance(truncated, Mapping):
        response = truncated.get("reduced_response")
    if isinstance(truncated, Mapping):
        notes.append(
            "this body was over the blob ceiling: texts may be cut short"
            + ("" if isinstance(request, Mapping) else ", and the request was not kept")
        )
    request = request if isinstance(request, Mapping) else {}
    response = response if isinstance(response, Mapping) else None
    if request.get("previous_response_id"):
        # A Responses call may continue a response stored by the provider: what that
        # one held is not in this request (it is in the call that got it, if recorded).
        notes.append(f"continues the stored response {request['previous_response_id']}")
    api, turns = request_turns(provider, request, response)
    stream = response.get("stream") if response is not None else None
    error = body.get("error")
    return Exchange(
        sequence=sequence,
        provider=provider,
        model=str(body.get("model") or request.get("model") or ""),
        api=api,
        turns=tuple(turns),
        answer=tuple(answer_turns(response)) if response is not None else (),
        error=_error_text(error) if isinstance(error, Mapping) else None,
        streamed=len(stream) if isinstance(stream, list) else None,
        raw_request=_pretty(body.get("raw_request")),
        raw_response=_pretty(body.get("raw_response")),
        notes=tuple(notes),
    )


def tool_run(sequence: int, body: Mapping[str, Any]) -> ToolRun:
    """One ``tool.call`` body (readable): its arguments as called, its result or error."""
    arguments = body.get("arguments")
    if isinstance(arguments, Mapping):
        args, kwargs = arguments.get("args") or [], arguments.get("kwargs") or {}
        arguments = kwargs if not args else {"args": args, "kwargs": kwargs}
    error = body.get("error")
    failed = _error_text(error) if isinstance(error, Mapping) else None
    latency = body.get("latency_ms")
    return ToolRun(
        sequence=sequence,
        tool=str(body.get("tool") or ""),
        arguments=_value_part(arguments),
        result=None if failed else _value_part(body.get("result")),
        error=failed,
        latency_ms=float(latency) if isinstance(latency, int | float) else None,
    )


# Requests -----------------------------------------------------------------------------


def request_turns(
    provider: str, request: Mapping[str, Any], response: Mapping[str, Any] | None
) -> tuple[str, list[Turn]]:
    """The API shape of ``request`` and the turns it sent."""
    messages = request.get("messages")
    if isinstance(messages, list):
        if provider == "anthropic" or "system" in request:
            return "messages", _anthropic_turns(request)
        return "chat completions", _chat_turns(messages)
    if _is_responses(request, response):
        return "responses", _responses_turns(request)
    if "prompt" in request:
        return "completions", [Turn("user", tuple(_content(request["prompt"])))]
    return "", []


def _is_responses(request: Mapping[str, Any], response: Mapping[str, Any] | None) -> bool:
    if "instructions" in request or "previous_response_id" in request:
        return True
    if "input" not in request:
        return False
    if response is None:
        return True
    stream = response.get("stream")
    if isinstance(stream, list):
        return any(str(_get(e, "type")).startswith("response.") for e in stream)
    return response.get("object") == "response"


class _Turns:
    """Turns as they are read, and the names of the tool calls seen so far (a tool
    result names the call it answers by id only)."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.names: dict[str, str] = {}

    def add(self, turn: Turn) -> None:
        for call in turn.tool_calls:
            self.names[call.call_id] = call.name
        self.turns.append(turn)

    def call(self, call: ToolCall) -> None:
        """A tool call item of its own (Responses): joined to the assistant turn just
        before it, so parallel calls show as one turn."""
        last = self.turns[-1] if self.turns else None
        if last is not None and last.role == "assistant" and not last.label:
            self.turns[-1] = Turn("assistant", last.parts, (*last.tool_calls, call))
            self.names[call.call_id] = call.name
        else:
            self.add(Turn("assistant", tool_calls=(call,)))

    def result(self, call_id: Any, parts: list[Part], *, error: bool = False) -> None:
        answered = str(call_id or "")
        name = self.names.get(answered, "")
        self.turns.append(Turn("tool", tuple(parts), answers=answered, tool=name, error=error))


def _chat_turns(messages: Sequence[Any]) -> list[Turn]:
    made = _Turns()
    for message in messages:
        if not isinstance(message, Mapping):
            made.add(Turn("user", (_json_part(message),)))
            continue
        role = str(message.get("role") or "user")
        parts = _content(message.get("content"))
        if isinstance(message.get("refusal"), str):
            parts.append(Part("note", f"refusal: {message['refusal']}"))
        if role == "tool":
            made.result(message.get("tool_call_id"), parts)
        elif role == "function":  # the legacy function-calling result
            made.turns.append(Turn("tool", tuple(parts), tool=str(message.get("name") or "")))
        else:
            calls = [_chat_call(c) for c in message.get("tool_calls") or []]
            if isinstance(message.get("function_call"), Mapping):
                calls.append(_chat_call({"function": message["function_call"]}))
            label = str(message.get("name") or "")
            made.add(Turn(role, tuple(parts), tuple(calls), label=label))
    return made.turns


def _chat_call(call: Any) -> ToolCall:
    if not isinstance(call, Mapping):
        return ToolCall("", "", _json_part(call))
    kind = str(call.get("type") or "function")
    detail = call.get(kind) or call.get("function") or {}
    arguments = detail.get("arguments", detail.get("input")) if isinstance(detail, Mapping) else ""
    name = detail.get("name") if isinstance(detail, Mapping) else ""
    return ToolCall(str(call.get("id") or ""), str(name or ""), _value_part(arguments))


def _responses_turns(request: Mapping[str, Any]) -> list[Turn]:
    made = _Turns()
    instructions = request.get("instructions")
    if instructions:
        made.add(Turn("system", tuple(_content(instructions)), label="instructions"))
    given = request.get("input")
    if isinstance(given, str):
        made.add(Turn("user", (_text_part(given),)))
        return made.turns
    for item in given if isinstance(given, list) else []:
        _responses_item(made, item)
    return made.turns


def _responses_item(made: _Turns, item: Any) -> None:
    if not isinstance(item, Mapping):
        made.add(Turn("user", (_json_part(item),)))
        return
    kind = item.get("type") or ("message" if "role" in item else "")
    if kind == "message":
        made.add(Turn(str(item.get("role") or "user"), tuple(_content(item.get("content")))))
    elif kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", item.get("input"))
        call_id, name = str(item.get("call_id") or ""), str(item.get("name") or "")
        made.call(ToolCall(call_id, name, _value_part(arguments)))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        made.result(item.get("call_id"), _content(item.get("output")))
    elif kind == "reasoning":
        summary = [_get(s, "text") for s in item.get("summary") or []]
        texts = [Part("thinking", str(t)) for t in summary if t]
        made.add(Turn("assistant", tuple(texts or [Part("note", "reasoning")]), label="reasoning"))
    elif kind == "item_reference":
        made.add(Turn("user", (Part("note", f"the stored item {item.get('id')}"),)))
    else:
        made.add(Turn("assistant", (_json_part(item),), label=str(kind)))


def _anthropic_turns(request: Mapping[str, Any]) -> list[Turn]:
    made = _Turns()
    system = request.get("system")
    if system:
        made.add(Turn("system", tuple(_content(system))))
    for message in request.get("messages") or []:
        if not isinstance(message, Mapping):
            made.add(Turn("user", (_json_part(message),)))
            continue
        role = str(message.get("role") or "user")
        content = message.get("content")
        blocks = content if isinstance(content, list) else [content]
        _anthropic_message(made, role, blocks)
    return made.turns


def _anthropic_message(made: _Turns, role: str, blocks: list[Any]) -> None:
    """One Messages API message: its tool results as tool turns, the rest of its blocks
    as one turn of ``role`` each time they come between results."""
    parts: list[Part] = []
    calls: list[ToolCall] = []

    def flush() -> None:
        if parts or calls:
            made.add(Turn(role, tuple(parts), tuple(calls)))
            parts.clear()
            calls.clear()

    for block in blocks:
        kind = _get(block, "type")
        if kind == "tool_result":
            flush()
            error = block.get("is_error") is True
            made.result(block.get("tool_use_id"), _content(block.get("content")), error=error)
        elif kind in ("tool_use", "server_tool_use"):
            name = str(block.get("name") or "")
            name += " (run by the provider)" if kind == "server_tool_use" else ""
            calls.append(
                ToolCall(str(block.get("id") or ""), name, _value_part(block.get("input")))
            )
        else:
            parts.extend(_content([block]))
    flush()


# Content ------------------------------------------------------------------------------


def _content(content: Any) -> list[Part]:
    """The parts of a message's content: a text, or a list of typed parts or blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [_text_part(content)] if content else []
    if not isinstance(content, list):
        return [_json_part(content)]
    parts: list[Part] = []
    for piece in content:
        parts.extend(_piece(piece))
    return parts


def _piece(piece: Any) -> list[Part]:
    if isinstance(piece, str):
        return [_text_part(piece)] if piece else []
    if not isinstance(piece, Mapping):
        return [_json_part(piece)]
    kind = str(piece.get("type") or "")
    if kind in ("text", "input_text", "output_text") and isinstance(piece.get("text"), str):
        return [_text_part(piece["text"])] if piece["text"] else []
    if kind == "refusal":
        return [Part("note", f"refusal: {piece.get('refusal')}")]
    if kind == "thinking":
        return [Part("thinking", str(piece.get("thinking") or ""))]
    if kind == "redacted_thinking":
        return [Part("note", "reasoning the provider keeps encrypted")]
    if kind in ("image_url", "input_image", "image", "input_audio", "file", "input_file"):
        return [Part("note", _media(kind, piece))]
    if kind == "document":
        return [Part("note", _media("document", piece))]
    return [_json_part(piece)]


def _media(kind: str, piece: Mapping[str, Any]) -> str:
    """A short note for an image, audio or file part: its kind and where it is."""
    detail = piece.get(kind)
    found: Mapping[str, Any] = detail if isinstance(detail, Mapping) else piece
    source = found.get("source")
    if isinstance(source, Mapping):
        found = source
    where: Any = ""
    for name in ("url", "image_url", "file_id", "filename", "media_type", "format"):
        where = found.get(name)
        if isinstance(where, Mapping):
            where = where.get("url")
        if where:
            break
    text = str(where or "")
    if len(text) > MEDIA_URL_CHARS:
        head = text.split(",", 1)[0] if text.startswith("data:") else text[:40]
        text = f"{head}… ({len(text):,} characters)"
    shown = {"image_url": "image", "input_image": "image", "input_audio": "audio"}.get(kind, kind)
    shown = "file" if shown == "input_file" else shown
    return f"{shown}: {text}" if text else shown


def _text_part(text: str) -> Part:
    """``text``, pretty-printed when it is a JSON object or array."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            value = json.loads(stripped)
        except ValueError:
            return Part("text", text)
        return Part("json", _pretty(value))
    return Part("text", text)


def _value_part(value: Any) -> Part:
    """A recorded value (tool arguments, a result): a text as :func:`_text_part` shows
    it, anything else as pretty JSON."""
    if isinstance(value, str):
        return _text_part(value)
    return _json_part(value)


def _json_part(value: Any) -> Part:
    return Part("json", _pretty(value))


def _pretty(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _get(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, Mapping) else None


def _error_text(error: Mapping[str, Any]) -> str:
    kind, message = error.get("type"), error.get("message")
    return f"{kind}: {message}" if message else str(kind or "error")


# Answers ------------------------------------------------------------------------------


def answer_turns(response: Mapping[str, Any]) -> list[Turn]:
    """What the model answered, as assistant turns (one per choice; a stream assembled)."""
    view = completion_view(response)
    choices = [c for c in view.get("choices") or [] if isinstance(c, Mapping)]
    thinking = _anthropic_thinking(response)
    turns = []
    for number, choice in enumerate(choices, start=1):
        label = f"choice {number}" if len(choices) > 1 else ""
        message = choice.get("message")
        if not isinstance(message, Mapping):  # a legacy completion's choice is its text
            turns.append(Turn("assistant", tuple(_content(choice.get("text"))), label=label))
            continue
        parts = [*(thinking if number == 1 else []), *_content(message.get("content"))]
        if isinstance(message.get("refusal"), str):
            parts.append(Part("note", f"refusal: {message['refusal']}"))
        calls = tuple(_chat_call(c) for c in message.get("tool_calls") or [])
        turns.append(
            Turn(str(message.get("role") or "assistant"), tuple(parts), calls, label=label)
        )
    return turns


def _anthropic_thinking(response: Mapping[str, Any]) -> list[Part]:
    """An Anthropic answer's thinking blocks (whole, or assembled from a stream's
    deltas), which the chat-shaped view of the answer leaves out."""
    blocks = response.get("content")
    if response.get("type") == "message" and isinstance(blocks, list):
        return [
            part
            for block in blocks
            if isinstance(block, Mapping) and block.get("type") in ("thinking", "redacted_thinking")
            for part in _piece(block)
        ]
    events = response.get("stream")
    if not isinstance(events, list):
        return []
    pieces = [
        str(e["delta"].get("thinking") or "")
        for e in events
        if isinstance(e, Mapping)
        and e.get("type") == "content_block_delta"
        and isinstance(e.get("delta"), Mapping)
        and e["delta"].get("type") == "thinking_delta"
    ]
    return [Part("thinking", "".join(pieces))] if pieces else []


# Folding ------------------------------------------------------------------------------


def _folded(made: Exchange, previous: Exchange | None) -> Exchange:
    """``made`` with the turns it shares with ``previous`` (its request, then its first
    answer) at the start folded."""
    if previous is None:
        return made
    before = [*previous.turns, *previous.answer[:1]]
    shared = 0
    for ours, theirs in zip(made.turns, before, strict=False):
        if _key(ours) != _key(theirs):
            break
        shared += 1
    if not shared:
        return made
    return replace(made, folded=shared, folded_from=previous.sequence)


def _key(turn: Turn) -> tuple[Any, ...]:
    """What makes two turns the same one sent again: an SDK resending an answer writes
    it in its own way (null content, argument spacing), so texts and arguments are
    compared as read, not as written."""
    parts = tuple((p.kind, p.text) for p in turn.parts)
    calls = tuple((c.call_id, c.name, _same_json(c.arguments.text)) for c in turn.tool_calls)
    return (turn.role, parts, calls, turn.answers)


def _same_json(text: str) -> Any:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text
