"""A TCP proxy in front of Postgres that can drop a connection right after a COMMIT.

It reads the wire protocol's message frames (no TLS: connect with ``sslmode=disable``)
and forwards them unchanged. Armed with :meth:`CommitDropper.cut`, it lets the next
commit reach the server, waits until the server reports it done, and closes both sides
before the client hears the answer: the database committed, the client sees a dropped
connection. That is the ambiguous commit a writer must survive without appending twice.

A commit is a ``COMMIT``, or a statement sent outside a transaction (autocommit, as the
recorder appends an event: one statement that commits on its own), whose answer ends
with the server ready for the next query.

Armed with :meth:`CommitDropper.refuse`, it also resets new connections as soon as it
accepts them, as a server that is down would: the writer's retries cannot get through.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from sqlalchemy import URL, Engine, create_engine

_STARTUP_MESSAGES = 1
"""The client's first message has no type byte (the startup packet)."""


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return bytes(data)


def _read_frame(sock: socket.socket, *, typed: bool) -> tuple[bytes, bytes]:
    """One message as (type byte or b"", whole frame as read)."""
    kind = _read_exact(sock, 1) if typed else b""
    head = _read_exact(sock, 4)
    (length,) = struct.unpack("!i", head)
    body = _read_exact(sock, length - 4)
    return kind, kind + head + body


def _commit_ends(kind: bytes, frame: bytes, *, idle: bool) -> bytes | None:
    """The type of the server's message that says this client message committed (None:
    it does not commit)."""
    # Simple query "COMMIT" (how psycopg commits), or a Parse of one.
    if kind == b"Q" and frame[5:].lstrip().upper().startswith(b"COMMIT"):
        return b"C"
    if kind == b"P":
        name_end = frame.index(b"\x00", 5)
        if frame[name_end + 1 :].lstrip().upper().startswith(b"COMMIT"):
            return b"C"
    # A statement bound outside a transaction (psycopg opens one with a simple "BEGIN"):
    # autocommit, done once the server is ready for the next query.
    if kind == b"B" and idle:
        return b"Z"
    return None


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: CommitDropper, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = socket.create_connection((proxy.upstream_host, proxy.upstream_port))
        # Frames are forwarded one by one: without this, Nagle's algorithm holds each
        # small frame after the first until the peer's (delayed) acknowledgement, some
        # 40 ms per statement, which made every proxied transaction crawl.
        for sock in (client, self.server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.cutting = threading.Event()
        self.cut_at = b"C"
        """The server's message after which a cut commit is dropped."""
        self.idle = False
        """No transaction is open (the server's last ReadyForQuery said so)."""
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._client_to_server, daemon=True).start()
        threading.Thread(target=self._server_to_client, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                sock.close()

    def _client_to_server(self) -> None:
        untyped = _STARTUP_MESSAGES
        with suppress(OSError, ConnectionError, ValueError):
            while not self.closed:
                kind, frame = _read_frame(self.client, typed=untyped == 0)
                untyped = max(untyped - 1, 0)
                ends = _commit_ends(kind, frame, idle=self.idle)
                if ends is not None and not self.cutting.is_set() and self.proxy.take_cut():
                    self.cut_at = ends
                    self.cutting.set()
                self.server.sendall(frame)
        self.close()

    def _server_to_client(self) -> None:
        with suppress(OSError, ConnectionError):
            while not self.closed:
                kind, frame = _read_frame(self.server, typed=True)
                if kind == b"Z":
                    self.idle = frame[5:6] == b"I"
                if self.cutting.is_set():
                    if kind == self.cut_at and (kind == b"Z" or frame[5:].startswith(b"COMMIT")):
                        self.proxy.record_cut()
                        break  # the server committed; the client never hears it
                    if kind == b"E":
                        break  # the commit failed on the server: drop all the same
                    continue
                self.client.sendall(frame)
        self.close()


class CommitDropper:
    """Listens on a free loopback port and proxies to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: float = 0
        self._every = 0
        self.commits = 0
        """COMMITs seen, cut or not."""
        self.cuts = 0
        """COMMITs that reached the server and whose answer the client never got."""
        self._refusing: float = 0
        self.refused = 0
        """Connections reset as soon as they were accepted (see :meth:`refuse`)."""
        self._links: list[_Link] = []
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, times: float = 1) -> None:
        """Drop the connection after each of the next ``times`` COMMITs (``math.inf``: all)."""
        with self._lock:
            self._armed = times

    def cut_every(self, every: int) -> None:
        """Drop the connection after every ``every``-th COMMIT from now on (0: never)."""
        with self._lock:
            self._every = every

    def refuse(self, times: float = 1) -> None:
        """Reset each of the next ``times`` new connections at once (``math.inf``: all;
        0: let them through again)."""
        with self._lock:
            self._refusing = times

    def _take_refusal(self) -> bool:
        with self._lock:
            if self._refusing <= 0:
                return False
            self._refusing -= 1
            self.refused += 1
            return True

    def take_cut(self) -> bool:
        with self._lock:
            self.commits += 1
            if self._every and self.commits % self._every == 0:
                return True
            if self._armed <= 0:
                return False
            self._armed -= 1
            return True

    def record_cut(self) -> None:
        with self._lock:
            self.cuts += 1

    def stop(self) -> None:
        self._stopped = True
        with suppress(OSError):
            self._listener.close()
        for link in self._links:
            link.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._take_refusal():
                # A zero linger makes close() send a reset, as a port nobody listens on does.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            link = _Link(self, client)
            self._links.append(link)
            link.start()


@contextmanager
def commit_dropper(host: str, port: int) -> Iterator[CommitDropper]:
    proxy = CommitDropper(host, port)
    try:
        yield proxy
    finally:
        proxy.stop()


def through(url: URL, proxy: CommitDropper) -> str:
    """``url`` (with its password) pointed at the proxy, without TLS."""
    proxied = url.set(host="127.0.0.1", port=proxy.port)
    proxied = proxied.update_query_dict({"sslmode": "disable", "gssencmode": "disable"})
    return proxied.render_as_string(hide_password=False)


@contextmanager
def dropping_commits(engine: Engine) -> Iterator[tuple[CommitDropper, Engine]]:
    """A commit dropper in front of ``engine``'s server, and an engine that connects
    through it (disposed at the end)."""
    url = engine.url
    with commit_dropper(url.host or "127.0.0.1", url.port or 5432) as proxy:
        writer = create_engine(through(url, proxy))
        try:
            yield proxy, writer
        finally:
            writer.dispose()
