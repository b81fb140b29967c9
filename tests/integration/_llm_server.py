"""The HTTP scaffolding of the local servers the tests talk to.

:class:`LoopbackServer` listens on 127.0.0.1 on a free port and serves from a thread of
its own, answering through a :class:`QuietHandler` subclass. :class:`LLMServer`, the
local LLM API server, keeps every request it receives (headers included, so a test can
prove what went over the wire and that nothing did during a replay) and every JSON
document it sends back, and writes a stream as server-sent events with chunked transfer
encoding, as the real APIs do. What it answers is left to a subclass
(``_openai_server.OpenAIServer``, ``_anthropic_server.AnthropicServer``), which answers
from the request alone.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit


class LoopbackServer:
    """An HTTP/1.1 server on 127.0.0.1, on a free port, in a thread; ``handler`` says
    what it answers.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    name: ClassVar[str] = "loopback-test-server"
    """The name of the serving thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True  # keep-alive connections must not block stop()
        # A connection reset between the poll that saw it and the accept would leave a
        # blocking accept waiting forever, and stop() behind it: a non-blocking listener
        # makes that accept fail at once (socketserver passes over the error).
        self._httpd.socket.setblocking(False)
        # A short poll interval lets stop() return at once instead of after half a second.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=self.name,
            daemon=True,
        )

    @property
    def address(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class QuietHandler(BaseHTTPRequestHandler):
    """A keep-alive request handler that logs nothing and answers JSON."""

    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stops talking frees its thread

    def read_body(self) -> bytes:
        """The request's body (``content-length`` bytes)."""
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        """Answer ``body`` as JSON with ``status`` and the ``headers`` given."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet


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
    events: tuple[tuple[str | None, str], ...] | None = None
    """``(event name, data)`` pairs of a stream; no ``event:`` line where the name is None."""


class LLMServer(LoopbackServer):
    """A local LLM API server; a subclass says what it answers.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    name: ClassVar[str] = "llm-test-server"
    base_path: ClassVar[str] = ""
    """What the SDK's base URL adds to the server's address."""
    request_id_header: ClassVar[str] = "x-request-id"
    request_id: ClassVar[str] = "req_test"
    """The request id every answer carries, in :attr:`request_id_header`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[ReceivedRequest] = []
        self.sent: list[Any] = []
        """The JSON documents sent back, in order: bodies, or each stream's event data
        (what :meth:`kept` keeps of it)."""
        super().__init__(_handler(self))

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        """The reply to the JSON ``request`` posted on ``path``."""
        raise NotImplementedError

    def kept(self, event: str | None, data: str) -> bool:
        """Whether an event of a stream is among the documents in :attr:`sent`."""
        return True

    def headers_for(self, status: int) -> dict[str, str]:
        """Headers a JSON answer with ``status`` carries besides the request id."""
        return {}

    def before_event(self, number: int) -> None:
        """Called in the handler's thread before a stream's ``number``-th event (from 0)
        is sent: a subclass may hold the stream there."""

    @property
    def base_url(self) -> str:
        """The SDK's base URL."""
        return f"{self.address}{self.base_path}"

    @property
    def requests(self) -> list[ReceivedRequest]:
        """A copy of the requests received so far."""
        with self._lock:
            return list(self._requests)

    def received(self, request: ReceivedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def answered(self, document: Any) -> None:
        with self._lock:
            self.sent.append(document)


def _handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.read_body()
            headers = {name.lower(): value for name, value in self.headers.items()}
            server.received(ReceivedRequest("POST", self.path, headers, body))
            reply = server.reply(urlsplit(self.path).path, json.loads(body or b"{}"))
            if reply.events is None:
                server.answered(reply.body)
                extra = {server.request_id_header: server.request_id}
                self.send_json(
                    reply.status, reply.body, {**extra, **server.headers_for(reply.status)}
                )
            else:
                events = reply.events
                server.answered([json.loads(data) for e, data in events if server.kept(e, data)])
                self._send_events(events)

        def _send_events(self, events: tuple[tuple[str | None, str], ...]) -> None:
            self.send_response(HTTPStatus.OK)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header(server.request_id_header, server.request_id)
            self.end_headers()
            try:
                for number, (event, data) in enumerate(events):
                    server.before_event(number)
                    text = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
                    chunk = text.encode()
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client closed the stream early: what it read is what it got

    return Handler


def pieces(text: str) -> list[str]:
    """``text`` cut into word-sized deltas that join back into it, as a stream sends it."""
    words = text.split(" ")
    return [word if i == 0 else f" {word}" for i, word in enumerate(words)]


def refused_url(path: str = "") -> str:
    """A loopback URL (with ``path`` after the port) where nothing listens: any request
    to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
