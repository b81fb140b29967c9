"""A TCP proxy in front of Postgres that cuts a connection right after COMMIT.

It reads the frontend protocol the client sends (the startup packet, then typed
messages) and counts simple-query ``COMMIT`` messages. For every ``every``-th one it lets
the server run the COMMIT, then closes both sockets as soon as the server answers, so
the transaction committed but the writer hears only a dropped connection: an ambiguous
commit, as a network cut makes it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104


class _Connection:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.armed = False
        self.lock = threading.Lock()

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class CommitCuttingProxy:
    """Listens on a free loopback port and forwards to ``target_port``.

    Args:
        target_port: the Postgres port.
        every: cut the connection after every ``every``-th COMMIT (0: never).
    """

    def __init__(self, target_port: int, *, every: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self.every = every
        self.commits = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[_Connection] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="commit-cutter", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for conn in list(self._open):
                conn.close()
        self._thread.join(timeout=10)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            conn = _Connection(client, server)
            with self._lock:
                self._open.add(conn)
            for pump in (self._upstream, self._downstream):
                threading.Thread(target=self._guard, args=(pump, conn), daemon=True).start()

    def _guard(self, pump: Callable[[_Connection], None], conn: _Connection) -> None:
        try:
            pump(conn)
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self._open.discard(conn)

    def _upstream(self, conn: _Connection) -> None:
        """Client → server, message by message, arming the cut on a counted COMMIT."""
        buffer = b""
        startup = True
        while True:
            chunk = conn.client.recv(65536)
            if not chunk:
                return
            buffer += chunk
            while True:
                if startup:
                    if len(buffer) < 8:
                        break
                    length, code = struct.unpack("!ii", buffer[:8])
                    if len(buffer) < length:
                        break
                    # SSL or GSS negotiation is answered with one byte; the startup
                    # packet itself comes next.
                    startup = code in (_SSL_REQUEST, _GSS_REQUEST)
                    message, buffer = buffer[:length], buffer[length:]
                else:
                    if len(buffer) < 5:
                        break
                    kind, length = buffer[:1], struct.unpack("!i", buffer[1:5])[0]
                    if len(buffer) < length + 1:
                        break
                    message, buffer = buffer[: length + 1], buffer[length + 1 :]
                    if kind == b"Q" and message[5:].rstrip(b"\0").strip().upper() == b"COMMIT":
                        self._count_commit(conn)
                conn.server.sendall(message)

    def _count_commit(self, conn: _Connection) -> None:
        with self._lock:
            self.commits += 1
            cut = self.every > 0 and self.commits % self.every == 0
        if cut:
            with conn.lock:
                conn.armed = True

    def _downstream(self, conn: _Connection) -> None:
        """Server → client; once armed, the COMMIT's answer is dropped with the link."""
        while True:
            chunk = conn.server.recv(65536)
            if not chunk:
                return
            with conn.lock:
                armed = conn.armed
            if armed:
                with self._lock:
                    self.cuts += 1
                return  # _guard closes both sockets: the answer never arrives
            conn.client.sendall(chunk)
