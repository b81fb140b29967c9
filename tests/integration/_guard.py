"""The socket guard the offline replays run under: it refuses, and keeps, every
connection the Python code opens except to the loopback ports it is told to allow.

Postgres and Kafka are reached through their C clients (libpq, librdkafka), which it
does not see, nor need to: they are the two services a replay may use. What it does
see is what a replay must never do, such as a model SDK (httpx) opening a connection.
"""

from __future__ import annotations

import socket
from typing import Any

from agent_blackbox.schemas import Settings

__all__ = ["SocketGuard", "port_of", "service_ports"]

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class SocketGuard:
    """Refuses every connection the Python code opens except to ``allowed`` ports of the
    loopback, and keeps the addresses refused (:attr:`refused`), for the block."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.refused: list[Any] = []
        self._saved: tuple[Any, Any] | None = None

    def __enter__(self) -> SocketGuard:
        self._saved = (socket.socket.connect, socket.socket.connect_ex)
        connect, connect_ex = self._saved
        guard = self

        def guarded_connect(sock: socket.socket, address: Any) -> None:
            guard.check(address)
            connect(sock, address)

        def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
            guard.check(address)
            result: int = connect_ex(sock, address)
            return result

        socket.socket.connect = guarded_connect  # type: ignore[method-assign,assignment]
        socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]
        return self

    def check(self, address: Any) -> None:
        """Let a connection to ``address`` through, or keep it and refuse it.

        Raises:
            ConnectionRefusedError: ``address`` is not an allowed loopback port.
        """
        if isinstance(address, tuple) and address[0] in _LOOPBACK and address[1] in self.allowed:
            return
        self.refused.append(address)
        raise ConnectionRefusedError(f"the socket guard refused a connection to {address!r}")

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None
        socket.socket.connect, socket.socket.connect_ex = self._saved  # type: ignore[method-assign]


def port_of(address: str) -> int:
    """The port of ``host:port``, of a URL (``http://host:port/path``) or of a database
    URL's ``host:port/name``."""
    return int(address.rsplit(":", 1)[1].split("/", 1)[0])


def service_ports(settings: Settings) -> set[int]:
    """The ports of Postgres and Kafka: what a replay may reach."""
    database = settings.database_url.split("@", 1)[1].split("/", 1)[0]
    return {port_of(database), *(port_of(broker) for broker in settings.kafka_bootstrap.split(","))}
