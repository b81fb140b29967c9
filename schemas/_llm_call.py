"""The ``llm.call`` body: how a provider's usage and tool calls become body fields, and
how the parsed view of a reply is derived from the raw response.

The recorder (which writes the newest version) and the migrator from v1 both use
these functions, so a migrated v1 body and a freshly recorded one say the same thing
the same way.

v3 stores the response once, as the raw JSON the provider sent: the choices and tool
calls that v1 and v2 kept beside it are derived when read (:func:`llm_reply`, from
:func:`completion_view`). v1 and v2 bodies read as v3 (their stored choices are
skipped by Avro resolution: the same view is derived from their raw response).

v2 changes two parts of v1:

- ``usage`` is ``{input_tokens, output_tokens, cached_tokens, total_tokens}`` (the first
  two name v1's ``prompt_tokens`` and ``completion_tokens`` as aliases, so Avro
  resolution alone reads a v1 usage, cached tokens 0; the migrator adds them), the
  cached part taken from ``usage.prompt_tokens_details.cached_tokens`` (Chat
  Completions) or ``usage.input_tokens_details.cached_tokens`` (Responses);
- each tool call carries its ``type`` and its arguments as canonical JSON text
  (``arguments_json``), or, when the model sent something that is not JSON, as the
  text it sent (``arguments_raw``, with ``arguments_json`` null).

The digests never cover bodies (they cover the raw request and response JSON), so a
body version changes nothing a replay checks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent_blackbox.schemas._canonical import canonical_text
from agent_blackbox.schemas._errors import NotSerialisable

LLM_CALL_VERSION = 4
"""The ``llm.call`` body version the recorder writes."""


def llm_usage(usage: Any) -> dict[str, int] | None:
    """The v2 ``usage`` record of a provider's usage JSON; None when there is none.

    OpenAI's counts (Chat Completions or Responses) are read as they are; Anthropic's
    are first put in the same terms by :func:`anthropic_usage`.
    """
    if not isinstance(usage, Mapping):
        return None
    if _ANTHROPIC_CACHE_COUNTS & usage.keys():
        usage = anthropic_usage(usage)
    input_tokens = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    output_tokens = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": cached,
        "total_tokens": _count(usage.get("total_tokens")) or input_tokens + output_tokens,
    }


def cache_write_tokens(usage: Any) -> int:
    """How many input tokens a call wrote to the provider's prompt cache (billed above
    the input price): Anthropic's ``cache_creation_input_tokens``, also as
    :func:`anthropic_usage` names it (``prompt_tokens_details.cache_creation_tokens``);
    0 for a usage without it."""
    if not isinstance(usage, Mapping):
        return 0
    if "cache_creation_input_tokens" in usage:
        return _count(usage.get("cache_creation_input_tokens"))
    details = usage.get("prompt_tokens_details")
    return _count(details.get("cache_creation_tokens")) if isinstance(details, Mapping) else 0


_ANTHROPIC_CACHE_COUNTS = frozenset({"cache_read_input_tokens", "cache_creation_input_tokens"})


def anthropic_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's usage JSON in the Chat Completions names the body and views read.

    Anthropic counts the input in three parts: ``input_tokens`` (after the last cache
    breakpoint), ``cache_creation_input_tokens`` (written to the cache by this call) and
    ``cache_read_input_tokens`` (read from it). OpenAI's ``prompt_tokens`` is the whole
    input with the cached part inside it, so the input here is the sum of all three,
    and the cached part is the part read from the cache only: tokens written to the
    cache were processed (and billed) in full, so they are input, not cached input.
    How many were written stays under ``prompt_tokens_details.cache_creation_tokens``
    here and in the raw response; the ``llm.call`` body has no field for it.
    """
    fresh = _count(usage.get("input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    prompt, completion = fresh + written + read, _count(usage.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": read, "cache_creation_tokens": written},
    }


def declared_tool_schemas(tools: Any) -> dict[str, Mapping[str, Any]]:
    """Tool name → the JSON Schema of its arguments, from a request's ``tools``: Chat
    Completions function tools (``{"type": "function", "function": {"name",
    "parameters"}}``) and Anthropic tools (``{"name", "input_schema"}``). Tools of other
    kinds (a provider's built-in tools) declare no schema and are left out."""
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        declared = function if isinstance(function, Mapping) else tool
        name = declared.get("name")
        schema = declared.get("parameters" if declared is function else "input_schema")
        if isinstance(name, str) and isinstance(schema, Mapping):
            schemas[name] = schema
    return schemas


def llm_tool_call(*, call_id: str, name: str, arguments: Any, kind: str) -> dict[str, Any]:
    """A v2 tool call: ``arguments`` as the model sent them (text, or already parsed)."""
    arguments_json, arguments_raw = _normalised_arguments(arguments)
    return {
        "id": call_id,
        "type": kind,
        "name": name,
        "arguments_json": arguments_json,
        "arguments_raw": arguments_raw,
    }


def llm_call_v1_to_v2(body: Mapping[str, Any]) -> dict[str, Any]:
    """Migrate an ``llm.call`` v1 body to v2 (a pure function; ``body`` is not changed).

    v1 kept prompt and completion tokens only; the cached part is read from the raw
    response the v1 body also holds. v1 tool calls kept the argument text as sent and
    no type; Chat Completions tool calls of that time were all ``function`` calls.
    """
    migrated = dict(body)
    usage = body.get("usage")
    if usage is not None:
        cached = llm_usage(_raw_usage(body.get("raw_response_json")))
        migrated["usage"] = {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "cached_tokens": cached["cached_tokens"] if cached else 0,
            "total_tokens": usage["total_tokens"],
        }
    migrated["tool_calls"] = [
        llm_tool_call(
            call_id=call["id"], name=call["name"], arguments=call["arguments_json"], kind="function"
        )
        for call in body.get("tool_calls") or ()
    ]
    return migrated


def _normalised_arguments(arguments: Any) -> tuple[str | None, str | None]:
    if arguments is None:
        return None, None
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        return canonical_text(parsed, path="llm.tool_call.arguments"), None
    except (ValueError, NotSerialisable):
        return None, arguments if isinstance(arguments, str) else repr(arguments)


def _raw_usage(raw_response_json: Any) -> Any:
    if not isinstance(raw_response_json, str):
        return None
    try:
        response = json.loads(raw_response_json)
    except ValueError:
        return None  # the output digest check will name a damaged response
    return response.get("usage") if isinstance(response, Mapping) else None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    try:
        return int(value)
    except (ValueError, OverflowError):  # NaN and infinity count nothing
        return 0
