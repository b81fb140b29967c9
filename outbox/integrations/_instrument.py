"""Recording every model call of the process: :func:`instrument` makes the HTTP
transports of ``httpx2`` and ``httpx`` themselves record, so every OpenAI and Anthropic
client, whoever made it and whenever (inside LangChain, pydantic-ai, a framework's own
default client, a module-level client made before), records into the run in force in
the task or thread that makes the call. Outside any run its requests pass through and
model calls are counted.

The default transports (``HTTPTransport``, ``AsyncHTTPTransport``) are patched, and every
transport built on them (a retrying transport wrapping one, a proxy mount). A client
given a transport of another kind (an aiohttp transport) is not: give it a
:class:`~agent_blackbox.outbox.integrations.RecordingTransport` around that one. Its
connections are reported as holes of the run all the same.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx2

from agent_blackbox.outbox.integrations.transport import HTTPX2, Kit, handle, handle_async

__all__ = ["instrument", "instrumented", "uninstrument"]

_LOCK = threading.Lock()
_ORIGINALS: dict[tuple[type[Any], str], Callable[..., Any]] = {}


def _targets() -> Iterator[tuple[type[Any], str, Kit, bool]]:
    yield httpx2.HTTPTransport, "handle_request", HTTPX2, False
    yield httpx2.AsyncHTTPTransport, "handle_async_request", HTTPX2, True
    try:
        import httpx
    except ImportError:  # pragma: no cover - only httpx2 clients exist in this process
        return
    from agent_blackbox.outbox.integrations._legacy import HTTPX

    yield httpx.HTTPTransport, "handle_request", HTTPX, False
    yield httpx.AsyncHTTPTransport, "handle_async_request", HTTPX, True


def instrument() -> None:
    """Make every ``httpx2`` and ``httpx`` client of this process record the model calls
    it sends into the run in force where each is made (see the module's docstring).

    Call it once, early (it is safe to call again); :func:`uninstrument` undoes it.
    """
    with _LOCK:
        for cls, name, kit, is_async in _targets():
            if (cls, name) in _ORIGINALS:
                continue
            original = getattr(cls, name)
            _ORIGINALS[(cls, name)] = original
            patched = _recording_async(original, kit) if is_async else _recording(original, kit)
            setattr(cls, name, patched)


def uninstrument() -> None:
    """Give the transports their own methods back."""
    with _LOCK:
        for (cls, name), original in _ORIGINALS.items():
            setattr(cls, name, original)
        _ORIGINALS.clear()


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return bool(_ORIGINALS)


def _recording(original: Callable[..., Any], kit: Kit) -> Callable[..., Any]:
    @functools.wraps(original)
    def handle_request(self: Any, request: Any) -> Any:
        return handle(kit, functools.partial(original, self), request)

    return handle_request


def _recording_async(original: Callable[..., Any], kit: Kit) -> Callable[..., Any]:
    @functools.wraps(original)
    async def handle_async_request(self: Any, request: Any) -> Any:
        return await handle_async(kit, functools.partial(original, self), request)

    return handle_async_request
