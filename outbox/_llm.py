"""The ``llm.call`` boundary for OpenAI-compatible chat completion JSON.

Bodies are written at :data:`agent_blackbox.schemas.LLM_CALL_VERSION` (v4): the raw
request and response once, plus the few summary fields views index on (response id,
finish reason, usage). Choices and tool calls are derived from the raw response when a
body is read (:func:`agent_blackbox.schemas.llm_reply`).

A body over the blob ceiling is not refused, since the model was already paid for:
:func:`truncated_llm_call` keeps the summary, the sizes and SHA-256 digests of what it
leaves out, and a reduced response in the response's own shape, so that replay can
hand back ids, finish reasons, tool calls and usage, and says it could not check the
rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from agent_blackbox.outbox._boundaries import Crossing, error_info
from agent_blackbox.schemas import (
    CANONICAL_V1,
    LLM_CALL_VERSION,
    Canonicalisation,
    EventType,
    cache_write_tokens,
    canonical_text,
    choice_view,
    declared_tool_schemas,
    digest_bytes,
    llm_usage,
    ordered_text,
    plain_ordered_text,
)
from agent_blackbox.schemas import completion_view as completion_view  # outbox re-exports it

if TYPE_CHECKING:
    from agent_blackbox.outbox._request_memo import RequestParts

# Request fields that are the conversation or the call itself, not sampling parameters.
_NOT_PARAMS = frozenset(
    {"messages", "tools", "model", "stream", "input", "instructions", "system", "tool_choice"}
)

# Room left under the ceiling for the other fields, Avro framing and sealing (nonce,
# tag): the texts a truncated body keeps are sized to the ceiling less this.
_HEADROOM = 64 * 1024

# Lengths a reduced response cuts its strings to, longest first: the first that fits
# is kept, so tool call arguments (short, and read by the agent's control flow) are
# usually kept whole while long texts are cut.
_CUT_LENGTHS = (64 * 1024, 4096, 256, 16)


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
    parts: RequestParts | None = None,
) -> Crossing:
    """A finished LLM call; ``response`` is the provider's raw JSON. ``parts`` are
    ``request``'s, when a :class:`RequestMemo` scrubbed it: its text is theirs."""
    # The error whole (its module and typed arguments too, as a tool's), so that replay
    # raises the class the code catches.
    err = error_info(error)
    params = {k: v for k, v in request.items() if k not in _NOT_PARAMS}
    reply = completion_view(response or {})
    choices = reply.get("choices") or []
    finish_reason = choice_view(choices[0])["finish_reason"] if choices else None
    usage = llm_usage(reply.get("usage"))
    body = {
        "provider": provider,
        "model": model,
        "request_params_json": canonical_text(params, path="llm.params"),
        "raw_request_json": canonical_text(dict(request), path="llm.request")
        if parts is None
        else parts.text(CANONICAL_V1),
        # The response is handed back in replay: stored in its own key order. The
        # request is the agent's input, checked by its digest and never handed back:
        # it stays canonical, which the prefix references (_prefixes) compose from.
        "raw_response_json": None
        if response is None
        else ordered_text(dict(response), path="llm.response"),
        "response_id": None if reply.get("id") is None else str(reply["id"]),
        "finish_reason": finish_reason,
        "usage": usage,
        "latency_ms": latency_ms,
        "error": err,
        "body_truncated": None,
        "request_prefix": None,
    }
    attributes = {"provider": provider, "model": model, "latency_ms": f"{latency_ms:.3f}"}
    if finish_reason:
        attributes["finish_reason"] = finish_reason
    if request.get("stream") is True:
        attributes["streamed"] = "true"
    requested = sum(len(_tool_calls(choice)) for choice in choices)
    if requested:
        attributes["tool_calls_requested"] = str(requested)
        invalid = invalid_tool_arguments(request, choices)
        if invalid is not None:
            attributes["tool_calls_invalid"] = str(len(invalid))
            if invalid:
                attributes["tool_calls_invalid_names"] = ",".join(sorted(set(invalid)))[:200]
    if usage:
        # Attribute names stay those of v1: views and analytics index on them.
        attributes.update(
            prompt_tokens=str(usage["input_tokens"]),
            completion_tokens=str(usage["output_tokens"]),
            cached_tokens=str(usage["cached_tokens"]),
            total_tokens=str(usage["total_tokens"]),
        )
        written = cache_write_tokens(reply.get("usage"))
        if written:  # priced above the input price: analytics need it apart
            attributes["cache_write_tokens"] = str(written)
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


def invalid_tool_arguments(request: Mapping[str, Any], choices: list[Any]) -> list[str] | None:
    """The names of the tool calls in ``choices`` whose arguments are not JSON or break
    the JSON Schema the request declared for that function; None when the request
    declared no schema for any tool called (validity is then unknown).

    The arguments are the model's: this is the quality of what it asked for, judged by
    the schema the agent gave it. A schema that is itself invalid counts as unknown.
    """
    schemas = declared_tool_schemas(request.get("tools"))
    checked = False
    invalid = []
    for choice in choices:
        for call in _tool_calls(choice):
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping):
                continue
            name = function.get("name")
            schema = schemas.get(name) if isinstance(name, str) else None
            if schema is None:
                continue
            verdict = _arguments_valid(schema, function.get("arguments"))
            if verdict is None:
                continue
            checked = True
            if not verdict:
                invalid.append(str(name))
    return invalid if checked else None


def _arguments_valid(schema: Mapping[str, Any], arguments: Any) -> bool | None:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return False
    plain = dict(schema)
    text = plain_ordered_text(plain)
    # An agent declares the same tools in every request: checking a schema against its
    # metaschema cost more than the rest of recording the call, so it is done once per
    # schema text (which tells schemas apart exactly).
    validator = _validator(plain) if text is None else _known_validator(text)
    if validator is None:
        return None
    from jsonschema.exceptions import SchemaError

    try:
        return bool(validator.is_valid(value))
    except SchemaError:
        return None


@lru_cache(maxsize=256)
def _known_validator(text: str) -> Any | None:
    """:func:`_validator` of the schema whose :func:`plain_ordered_text` is ``text``."""
    return _validator(json.loads(text))


def _validator(schema: dict[str, Any]) -> Any | None:
    """A validator of ``schema``; None when the schema itself is invalid."""
    # jsonschema is loaded on the first call that has a schema to check against.
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator = validator_for(schema)
        validator.check_schema(schema)
    except SchemaError:
        return None
    return validator(schema)


def _tool_calls(choice: Any) -> list[Any]:
    message = choice.get("message") if isinstance(choice, Mapping) else None
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    return calls if isinstance(calls, list) else []


def truncated_llm_call(
    crossing: Crossing,
    *,
    body_bytes: int,
    ceiling: int,
    canonical: Canonicalisation = CANONICAL_V1,
) -> Crossing:
    """``crossing`` (an :func:`llm_call`) with a body that fits under ``ceiling`` bytes.

    The input and output (and so the envelope's digests) stay those of the whole call:
    the request is the agent's own, so replay still checks it by its digest; the output
    digest is of the whole response, which replay can no longer check and says so.
    The body keeps the summary fields and, in ``body_truncated``, the sizes and
    SHA-256 digests of the raw request and response and what it kept of them:

    1. the raw request, when it takes at most a quarter of the room (else it is left
       out: re-execution cannot re-send this call);
    2. the raw response whole, when it fits in the rest;
    3. otherwise a reduced response: its own shape, every string cut to the longest
       of ``_CUT_LENGTHS`` that fits, and a recorded stream's text-only chunks after
       the first dropped; none when even that does not fit.

    Args:
        crossing: the LLM call as :func:`llm_call` built it.
        body_bytes: the size of its encoded body, which was over ``ceiling``.
        ceiling: the largest body the store keeps (``Settings.max_blob_bytes``).
        canonical: the run's canonicalisation, which the digests of the request and
            the response are taken over.
    """
    body = dict(crossing.body)
    room = max(ceiling - _HEADROOM - _utf8_size(body["request_params_json"]), 0)
    request_text: str = body["raw_request_json"]
    response_text: str | None = body["raw_response_json"]
    request_size, response_size = _utf8_size(request_text), _utf8_size(response_text or "")
    keep_request = request_size <= room // 4
    room -= request_size if keep_request else 0
    reduced = None
    if response_text is not None and response_size > room:
        reduced = _reduced(crossing.output["response"], room)
        response_text = None
    body["raw_request_json"] = request_text if keep_request else None
    body["raw_response_json"] = response_text
    whole = request_text.encode("utf-8")
    if body.get("request_prefix") is not None or canonical is not CANONICAL_V1:
        # Stored by reference (the sizes are the whole's), or hashed in another form.
        whole = canonical.json(dict(crossing.input["request"]), path="llm.request")
        if not keep_request:
            body["request_prefix"] = None
    body["body_truncated"] = {
        "body_bytes": body_bytes,
        "ceiling_bytes": ceiling,
        "request_bytes": len(whole),
        "request_sha256": digest_bytes(whole),
        "response_bytes": response_size,
        "response_sha256": _response_sha256(crossing, canonical),
        "reduced_response_json": reduced,
    }
    attributes = {**crossing.attributes, "body_truncated": "true"}
    return replace(crossing, body=body, attributes=attributes)


def _response_sha256(crossing: Crossing, canonical: Canonicalisation) -> str | None:
    """SHA-256 of the canonical JSON of the whole response. The stored text is ordered
    JSON (``response_bytes`` is its size), not what is hashed."""
    if crossing.body["raw_response_json"] is None:
        return None
    return canonical.digest(dict(crossing.output["response"]), path="llm.response")


def _reduced(response: Mapping[str, Any], room: int) -> str | None:
    """Ordered JSON of ``response`` (replay hands it back) reduced to at most ``room``
    UTF-8 bytes, or None."""
    for length in _CUT_LENGTHS:
        kept = _cut(response, length)
        if isinstance(kept.get("stream"), list):
            kept["stream"] = _thinned(kept["stream"])
        text = ordered_text(kept, path="llm.response")
        if _utf8_size(text) <= room:
            return text
    return None


def _cut(value: Any, length: int) -> Any:
    if isinstance(value, str):
        return value[:length]
    if isinstance(value, Mapping):
        return {k: _cut(v, length) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, length) for v in value]
    return value


def _thinned(chunks: list[Any]) -> list[Any]:
    """The chunks of a stream without its text-only ones after the first: those carry
    nothing but more text, and a long stream is mostly them."""
    kept: list[Any] = []
    seen_text = False
    for chunk in chunks:
        if _text_only(chunk):
            if seen_text:
                continue
            seen_text = True
        kept.append(chunk)
    return kept


def _text_only(chunk: Any) -> bool:
    if not isinstance(chunk, Mapping):
        return False
    kind = chunk.get("type")
    if kind == "content_block_delta":  # an Anthropic Messages event
        delta = chunk.get("delta")
        return isinstance(delta, Mapping) and delta.get("type") in ("text_delta", "thinking_delta")
    if isinstance(kind, str):  # a Responses API event
        return kind in ("response.output_text.delta", "response.reasoning_text.delta")
    choices = chunk.get("choices")
    if chunk.get("usage") or not isinstance(choices, list) or not choices:
        return False
    return all(
        isinstance(c, Mapping)
        and not c.get("finish_reason")
        and isinstance(c.get("delta"), Mapping)
        and _text_keys(c["delta"])
        for c in choices
    )


def _text_keys(delta: Mapping[str, Any]) -> bool:
    """Whether a delta carries text and nothing else (a role may come with it)."""
    keys = {k for k, v in delta.items() if v}
    return "content" in keys and keys <= {"content", "role"}


def _utf8_size(text: str) -> int:
    # ASCII text (most JSON) is measured without encoding a copy of it.
    return len(text) if text.isascii() else len(text.encode("utf-8"))
