"""The recording transports for clients of ``httpx``, the library ``httpx2`` grew from
(SDK releases before ``openai`` 3, frameworks that build their own ``httpx`` clients).
The same recording as ``transport.py``; only the library's classes differ."""

from __future__ import annotations

from typing import Any

import httpx

from agent_blackbox.outbox.integrations.transport import (
    AsyncTee,
    Kit,
    SyncTee,
    handle,
    handle_async,
)

__all__ = ["HTTPX", "LegacyAsyncRecordingTransport", "LegacyRecordingTransport"]


class _LegacySyncTee(SyncTee, httpx.SyncByteStream):
    """:class:`SyncTee`, as a stream ``httpx`` accepts."""


class _LegacyAsyncTee(AsyncTee, httpx.AsyncByteStream):
    """:class:`AsyncTee`, as a stream ``httpx`` accepts."""


HTTPX = Kit(httpx, httpx.Response, _LegacySyncTee, _LegacyAsyncTee)


class LegacyRecordingTransport(httpx.BaseTransport):
    """:class:`~agent_blackbox.outbox.integrations.RecordingTransport` for ``httpx``."""

    def __init__(self, transport: httpx.BaseTransport | None = None, *, run: Any = None) -> None:
        self._owned = transport is None
        self.transport = transport if transport is not None else httpx.HTTPTransport()
        self.run = run

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = handle(HTTPX, self.transport.handle_request, request, self.run)
        return response

    def close(self) -> None:
        if self._owned:
            self.transport.close()


class LegacyAsyncRecordingTransport(httpx.AsyncBaseTransport):
    """:class:`~agent_blackbox.outbox.integrations.AsyncRecordingTransport` for ``httpx``."""

    def __init__(
        self, transport: httpx.AsyncBaseTransport | None = None, *, run: Any = None
    ) -> None:
        self._owned = transport is None
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.run = run

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = await handle_async(
            HTTPX, self.transport.handle_async_request, request, self.run
        )
        return response

    async def aclose(self) -> None:
        if self._owned:
            await self.transport.aclose()
