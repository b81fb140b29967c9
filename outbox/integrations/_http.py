"""What an HTTP exchange with a model provider is, as the recording transports see it:
which requests are model calls, what of them is recorded, and the HTTP answer replay
gives back. No I/O here, and nothing of either HTTP library's (``httpx2``, ``httpx``):
the transports (``transport.py``, ``_legacy.py``) do the sending.

A model call is a ``POST`` whose path ends like one of the provider APIs below, on any
host (an OpenAI-compatible server is recognised by its paths). It is recorded as an
``llm.call``: the request is the JSON body exactly as the client sent it (``extra_body``
merged, as sent), never a header, the URL or a credential; the answer is the JSON body,
or a streamed body's server-sent events as ``{"stream": [event, ...]}`` (each event's
JSON data); an HTTP error status is recorded as the call's error, named like the SDKs
name it (``RateLimitError`` for 429), with its status, body and the few headers that
decide what a client does next (``retry-after``, ``x-should-retry``, the request id).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_blackbox.schemas import NotSerialisable, canonical_text

__all__ = [
    "API_ERRORS",
    "Endpoint",
    "ProviderError",
    "endpoint_of",
    "error_answer",
    "recorded_answer",
    "replayed_body",
    "request_json",
    "sse_events",
]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One provider API a recording transport recognises."""

    provider: str
    """The provider name the call is recorded under (the API's shape: ``openai`` for
    any OpenAI-compatible server)."""
    api: str
    """``chat.completions``, ``responses``, ``messages``, ...: shown on the event."""
    named_events: bool = False
    """Whether its streams name each event after its ``type`` (``event: ...`` lines)."""
    done_marker: bool = False
    """Whether its streams end with ``data: [DONE]``."""


_OPENAI_PATHS = (
    ("/chat/completions", Endpoint("openai", "chat.completions", done_marker=True)),
    ("/responses/input_tokens", Endpoint("openai", "responses.input_tokens")),
    ("/responses", Endpoint("openai", "responses", named_events=True)),
    ("/completions", Endpoint("openai", "completions", done_marker=True)),
    ("/embeddings", Endpoint("openai", "embeddings")),
    ("/moderations", Endpoint("openai", "moderations")),
)
_ANTHROPIC_PATHS = (
    ("/messages/count_tokens", Endpoint("anthropic", "messages.count_tokens")),
    ("/messages", Endpoint("anthropic", "messages", named_events=True)),
    ("/complete", Endpoint("anthropic", "completions")),
)


def endpoint_of(method: str, path: str, headers: Mapping[str, str]) -> Endpoint | None:
    """The provider API a request calls, or None when it is not a model call.

    Anthropic's paths are recognised by the ``anthropic-version`` header every
    Anthropic client sends (an OpenAI Assistants thread also has ``/messages``).
    """
    if method != "POST":
        return None
    path = path.rstrip("/")
    if "anthropic-version" in headers:
        return next((e for suffix, e in _ANTHROPIC_PATHS if path.endswith(suffix)), None)
    return next((e for suffix, e in _OPENAI_PATHS if path.endswith(suffix)), None)


def request_json(body: bytes) -> dict[str, Any] | None:
    """The request body as JSON, keys in the order sent; None when it is not a JSON
    object (a file upload, a form)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


# Answers --------------------------------------------------------------------------------

API_ERRORS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    529: "OverloadedError",
}
"""The name an error status is recorded under, as the OpenAI and Anthropic SDKs name the
exception they raise for it (5xx: ``InternalServerError``, other: ``APIStatusError``)."""

_KEPT_HEADERS = ("content-type", "retry-after", "retry-after-ms", "x-should-retry")
_REQUEST_ID_HEADERS = ("x-request-id", "request-id")


class ProviderError(Exception):
    """An HTTP error status from the provider, as recorded: raised inside the recorded
    call so that the run records it as the call's error; the client is then given the
    response itself and raises its own error from it."""

    def __init__(self, status: int, text: str, headers: Mapping[str, str]) -> None:
        body = _json_or_none(text)
        self.status = status
        kept = {k: headers[k] for k in (*_KEPT_HEADERS, *_REQUEST_ID_HEADERS) if k in headers}
        details = {
            "message": _message(body, text, status),
            "status_code": status,
            "body": body,
            "response_text": text,
            "headers": kept,
        }
        name = API_ERRORS.get(status) or ("InternalServerError" if status >= 500 else None)
        name = name or "APIStatusError"
        try:
            message = canonical_text(details, path="llm.error")
        except NotSerialisable:  # a body with NaN: kept as text only
            message = canonical_text({**details, "body": None}, path="llm.error")
        self.recorded_error = {"type": name, "message": message}
        super().__init__(f"{name}: HTTP {status}")


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _message(body: Any, text: str, status: int) -> str:
    error = body.get("error") if isinstance(body, Mapping) else None
    found = error.get("message") if isinstance(error, Mapping) else None
    return str(found) if found else (text[:500] or f"HTTP {status}")


def recorded_answer(
    status: int, content_type: str, text: str, headers: Mapping[str, str]
) -> dict[str, Any]:
    """What a finished exchange records as the call's response.

    Raises:
        ProviderError: an error status (recorded as the call's error), or a success
            whose body is neither JSON nor events (recorded so, with its text).
    """
    if status >= 400:
        raise ProviderError(status, text, headers)
    if content_type.startswith("text/event-stream"):
        return {"stream": sse_events(text)}
    body = _json_or_none(text)
    if not isinstance(body, dict):
        raise ProviderError(status, text, headers)
    return body


def sse_events(text: str) -> list[Any]:
    """The events of a server-sent event stream, each its data as JSON (the ``[DONE]``
    marker left out; data that is not JSON kept as its text)."""
    from httpx2 import EventSource, Request, Response  # the library's parser of the format

    read = Response(
        200,
        headers={"content-type": "text/event-stream"},
        text=text,
        request=Request("POST", "http://recorded.invalid/"),  # the parser names one in errors
    )
    source = EventSource(read)
    events: list[Any] = []
    for event in source:
        if event.data == "[DONE]":
            continue
        data = _json_or_none(event.data)
        events.append(event.data if data is None else data)
    return events


def replayed_body(endpoint: Endpoint, answer: Mapping[str, Any]) -> tuple[str, bytes]:
    """The content type and body replay answers with, from a recorded response."""
    stream = answer.get("stream")
    if isinstance(stream, list) and set(answer) == {"stream"}:
        return "text/event-stream", _sse_bytes(endpoint, stream)
    return "application/json", _json_bytes(answer)


def _sse_bytes(endpoint: Endpoint, events: Iterable[Any]) -> bytes:
    lines: list[str] = []
    for event in events:
        data = event if isinstance(event, str) else _json_bytes(event).decode()
        kind = event.get("type") if isinstance(event, Mapping) else None
        if endpoint.named_events and isinstance(kind, str):
            lines.append(f"event: {kind}\n")
        lines.append(f"data: {data}\n\n")
    if endpoint.done_marker:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An HTTP error response replay answers with, from a recorded error."""

    status: int
    headers: dict[str, str]
    content: bytes


def error_answer(message: str) -> ErrorAnswer | None:
    """The HTTP error a recorded error stands for (a recorded status), or None when it is
    not one (a transport error, an error of the recorder's)."""
    details = _json_or_none(message)
    if not isinstance(details, Mapping) or not isinstance(details.get("status_code"), int):
        return None
    status = details["status_code"]
    text = details.get("response_text")
    if not isinstance(text, str):
        body = details.get("body")
        text = "" if body is None else _json_bytes(body).decode()
    recorded = details.get("headers")
    headers = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}
    headers.setdefault("content-type", "application/json")
    if status == 429 or status >= 500:
        # The client waits before it tries again; in replay the answer is already here.
        headers["retry-after-ms"] = "1"
    return ErrorAnswer(status, headers, text.encode())
