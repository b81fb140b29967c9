"""Redaction of a streamed LLM response across its chunks.

A stream is recorded as ``{"stream": [chunk, ...]}``, and the text of one answer comes
in pieces, a few characters a chunk: an e-mail address or a key is split over several
chunks, and no detector sees it in any one of them. So before the chunks are scrubbed
one by one, the pieces of each channel (one choice's text, one tool call's arguments,
one content block of an Anthropic message, one output item of a Responses API stream,
and from redaction version 3 on one choice's text of a legacy completions stream) are
put together and the whole text is redacted. When a rule fires, the redacted text
is dealt back into the same chunks, each taking as many characters as it held (the last
takes the rest), so that the chunks still add up to the answer, now redacted; the
chunking around a placeholder may differ from the model's.

The chunks are copied where they change: the caller's objects are left as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

ChannelKey: TypeAlias = tuple[Any, ...]
Path: TypeAlias = tuple[str | int, ...]

_CHAT_TEXT = ("content", "reasoning_content", "reasoning", "refusal")
"""Text fields of a chat completion chunk's delta."""
_BLOCK_TEXT = ("text", "partial_json", "thinking")
"""Text fields of an Anthropic ``content_block_delta``'s delta."""


def redacted_stream(
    response: Any, redact: Callable[[str], str], *, completions: bool = False
) -> Any:
    """``response`` with the text of each stream channel redacted as a whole by
    ``redact``; ``response`` itself when it is not a stream or nothing changed.

    With ``completions`` (redaction version 3 on), the ``choices[].text`` of a legacy
    completions stream is a channel too (version 2 runs replay without it)."""
    chunks = response.get("stream") if isinstance(response, Mapping) else None
    if not isinstance(chunks, list):
        return response
    channels: dict[ChannelKey, list[tuple[int, Path, str]]] = {}
    for at, chunk in enumerate(chunks):
        for key, path, text in _pieces(chunk, completions):
            channels.setdefault(key, []).append((at, path, text))
    edits: list[tuple[int, Path, str]] = []
    for pieces in channels.values():
        if len(pieces) < 2:
            continue  # one piece is scrubbed where it is, like any other value
        whole = "".join(text for _, _, text in pieces)
        redacted = redact(whole)
        if redacted != whole:
            edits += _dealt(pieces, redacted)
    if not edits:
        return response
    out = list(chunks)
    for at, path, text in edits:
        out[at] = _with(out[at], path, text)
    return {**response, "stream": out}


def _dealt(pieces: list[tuple[int, Path, str]], text: str) -> Iterator[tuple[int, Path, str]]:
    """``text`` dealt into ``pieces``: each takes as many characters as it held, the
    last the rest."""
    at = 0
    for n, (chunk, path, held) in enumerate(pieces):
        end = len(text) if n == len(pieces) - 1 else min(at + len(held), len(text))
        yield chunk, path, text[at:end]
        at = end


def _pieces(chunk: Any, completions: bool) -> Iterator[tuple[ChannelKey, Path, str]]:
    """The text pieces of one chunk: (its channel, where it is, the text)."""
    if not isinstance(chunk, Mapping):
        return
    kind = chunk.get("type")
    delta = chunk.get("delta")
    if kind == "content_block_delta" and isinstance(delta, Mapping):  # Anthropic
        for name in _BLOCK_TEXT:
            if isinstance(delta.get(name), str):
                yield ("block", chunk.get("index"), name), ("delta", name), delta[name]
        return
    if isinstance(kind, str) and kind.endswith(".delta") and isinstance(delta, str):
        # A Responses API event: one channel per output item and content part.
        where = (chunk.get("item_id"), chunk.get("output_index"), chunk.get("content_index"))
        yield ("event", kind, *where), ("delta",), delta
        return
    choices = chunk.get("choices")
    if isinstance(choices, list):  # a chat completion chunk
        yield from _choice_pieces(choices)
        if completions:  # a legacy completions chunk: {"choices": [{"text": ...}]}
            yield from _text_pieces(choices)


def _choice_pieces(choices: list[Any]) -> Iterator[tuple[ChannelKey, Path, str]]:
    for place, choice in enumerate(choices):
        if not isinstance(choice, Mapping) or not isinstance(choice.get("delta"), Mapping):
            continue
        index, delta = choice.get("index", place), choice["delta"]
        for name in _CHAT_TEXT:
            if isinstance(delta.get(name), str):
                yield ("choice", index, name), ("choices", place, "delta", name), delta[name]
        calls = delta.get("tool_calls")
        for slot, call in enumerate(calls if isinstance(calls, list) else ()):
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                path: Path = ("choices", place, "delta", "tool_calls", slot, "function")
                key = ("tool", index, call.get("index", slot))
                yield key, (*path, "arguments"), function["arguments"]


def _text_pieces(choices: list[Any]) -> Iterator[tuple[ChannelKey, Path, str]]:
    for place, choice in enumerate(choices):
        if isinstance(choice, Mapping) and isinstance(choice.get("text"), str):
            index = choice.get("index", place)
            yield ("text", index), ("choices", place, "text"), choice["text"]


def _with(value: Any, path: Path, text: str) -> Any:
    """A copy of ``value`` with ``text`` at ``path`` (copied along the path only)."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        assert isinstance(head, int)
        copied = list(value)
        copied[head] = _with(value[head], rest, text)
        return copied
    return {**value, head: _with(value[head], rest, text)}
