"""A local Anthropic-compatible HTTP server for the SDK capture tests.

It serves ``POST /v1/messages``, plain and streamed (server-sent events with their
``event:`` names, sent with chunked transfer encoding as the real API does: the Messages
API sequence ``message_start``, ``ping``, ``content_block_start``,
``content_block_delta`` (``text_delta`` and ``input_json_delta``),
``content_block_stop``, ``message_delta``, ``message_stop``), and answers
deterministically from the request alone, so a test knows every byte it will get.
Every request it receives is kept, headers included, so a test can prove what went over
the wire and that nothing did during a replay.

What it answers is chosen by the request:

- ``model`` ``"fail-<status>"`` (``fail-400``, ``fail-429``, ``fail-529``): an Anthropic
  error body (``{"type": "error", "error": {"type", "message"}}``) with that HTTP status;
- ``model`` ``"fail-midstream"`` with ``stream``: a stream that starts, then sends an
  ``error`` event (overloaded);
- ``tools`` present (and the last user turn not a tool result): a short text block,
  then a ``tool_use`` block calling the first tool, stop reason ``tool_use``. Its input
  is the tool's declared properties whose ``name=value`` words appear in the last user
  text, as if the model read them there; when none does, ``{"city": "Paris"}``;
- otherwise: one text block ``"echo: <last user text>"``, stop reason ``end_turn``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

TOOL_INPUT = {"city": "Paris"}
REQUEST_ID = "req_anthropic_test_0001"
PREFACE = "Let me look that up."
USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 3,
    "cache_read_input_tokens": 8,
    "output_tokens": 5,
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """What the server sends back: a JSON body, or a list of SSE events."""

    status: int
    body: Any = None
    events: tuple[tuple[str, str], ...] | None = None
    """``(event name, data)`` pairs of a stream."""


class AnthropicServer:
    """Serves the Messages API on 127.0.0.1 on a free port, in a thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[ReceivedRequest] = []
        self.sent: list[Any] = []
        """The JSON documents sent back, in order: bodies, or each stream's event data
        (without ``ping``)."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True  # keep-alive connections must not block stop()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="anthropic-test-server",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        """The SDK's base URL (it appends ``/v1/messages``)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[ReceivedRequest]:
        """A copy of the requests received so far."""
        with self._lock:
            return list(self._requests)

    def start(self) -> AnthropicServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> AnthropicServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def received(self, request: ReceivedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def answered(self, document: Any) -> None:
        with self._lock:
            self.sent.append(document)


def _handler(server: AnthropicServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30  # a client that stops talking frees its thread

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            headers = {name.lower(): value for name, value in self.headers.items()}
            server.received(ReceivedRequest("POST", self.path, headers, body))
            reply = answer(urlsplit(self.path).path, json.loads(body or b"{}"))
            if reply.events is None:
                server.answered(reply.body)
                self._send_json(reply.status, reply.body)
            else:
                kept = [json.loads(data) for name, data in reply.events if name != "ping"]
                server.answered(kept)
                self._send_events(reply.events)

        def _send_json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", REQUEST_ID)
            self.end_headers()
            self.wfile.write(data)

        def _send_events(self, events: tuple[tuple[str, str], ...]) -> None:
            self.send_response(HTTPStatus.OK)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("request-id", REQUEST_ID)
            self.end_headers()
            for event, data in events:
                chunk = f"event: {event}\ndata: {data}\n\n".encode()
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet

    return Handler


# Answers ---------------------------------------------------------------------------


def answer(path: str, request: Mapping[str, Any]) -> Reply:
    """The deterministic reply to ``request`` on ``path``."""
    if path != "/v1/messages":
        return _failure(HTTPStatus.NOT_FOUND, f"no route {path}")
    model = str(request.get("model") or "")
    streamed = bool(request.get("stream"))
    if model == "fail-midstream" and streamed:
        return Reply(HTTPStatus.OK, events=tuple(_failing_events(request)))
    if model.startswith("fail-"):
        status = int(model.removeprefix("fail-"))
        return _failure(status, f"the test server fails with {status}")
    message = message_for(request)
    if streamed:
        return Reply(HTTPStatus.OK, events=tuple(events_for(request, message)))
    return Reply(HTTPStatus.OK, message)


def _failure(status: int, text: str) -> Reply:
    kind = _ERROR_TYPES.get(status, "api_error")
    error = {"type": "error", "error": {"type": kind, "message": text}, "request_id": REQUEST_ID}
    return Reply(status, error)


def last_user_text(request: Mapping[str, Any]) -> str:
    """The text of the last user turn (a tool result counts as its content)."""
    texts = [m.get("content") for m in request.get("messages") or [] if m.get("role") == "user"]
    content = texts[-1] if texts else ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(str(block.get("text")))
        elif block.get("type") == "tool_result":
            parts.append(f"tool_result:{block.get('content')}")
    return " ".join(parts)


def _tool_input(request: Mapping[str, Any], tool: Mapping[str, Any]) -> dict[str, Any]:
    words = dict(word.split("=", 1) for word in last_user_text(request).split() if "=" in word)
    declared = (tool.get("input_schema") or {}).get("properties") or {}
    found = {name: words[name] for name in declared if name in words}
    return found or dict(TOOL_INPUT)


def message_for(request: Mapping[str, Any]) -> dict[str, Any]:
    """The whole message the server answers ``request`` with."""
    tools = request.get("tools") or []
    if tools and not last_user_text(request).startswith("tool_result:"):
        content: list[dict[str, Any]] = [
            {"type": "text", "text": PREFACE},
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": str(tools[0]["name"]),
                "input": _tool_input(request, tools[0]),
            },
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": f"echo: {last_user_text(request)}"}]
        stop = "end_turn"
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": dict(USAGE),
    }


def _pieces(text: str) -> list[str]:
    """``text`` cut into word-sized deltas that join back into it."""
    words = text.split(" ")
    return [word if i == 0 else f" {word}" for i, word in enumerate(words)]


def _start(message: Mapping[str, Any]) -> dict[str, Any]:
    usage = {**USAGE, "output_tokens": 1}
    started = {**message, "content": [], "stop_reason": None, "usage": usage}
    return {"type": "message_start", "message": started}


def events_for(request: Mapping[str, Any], message: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The server-sent events of ``message``, streamed."""
    events: list[dict[str, Any]] = [_start(message), {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            for piece in _pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                }
            )
            whole = json.dumps(block["input"])
            half = len(whole) // 2
            for part in (whole[:half], whole[half:]):
                delta = {"type": "input_json_delta", "partial_json": part}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": USAGE["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    for event in events:
        yield event["type"], json.dumps(event)


def _failing_events(request: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    message = message_for({**request, "tools": []})
    yield "message_start", json.dumps(_start(message))
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    yield "error", json.dumps(error)
