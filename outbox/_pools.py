"""Requests sent over pooled connections: the holes the socket watch cannot see.

An HTTP client keeps its connections open between requests (keep-alive). A model client
that records nothing (no :func:`~agent_blackbox.instrument`, no recording
``http_client``) connects once, and then sends every later request over that connection:
the rest of the run's calls, the calls of the next runs, and those of a replay in the same
process. The socket watch (``_network``) sees connections, not requests, so it would see
the first run's first call and nothing after it: later runs would record no hole, and a
replay in the same process would go online and pass. LangChain's ``ChatAnthropic`` shares
one such client between all its instances, so this is the usual case, not a corner.

So the connection pools of ``httpcore2`` (under ``httpx2``, the openai and anthropic
SDKs' HTTP library) and of ``httpcore`` (under ``httpx``) are watched as well: a request
a pool sends from a context where a run is in force, outside any boundary's own work, is
a hole, reported and refused like a connection (see ``_network``), but named after the
request (``POST /v1/messages to host:port``). A refused request is answered with a
``400`` that says why, whose ``x-should-retry: false`` keeps the SDKs from trying again
(as a recording transport refuses). What a recording transport sends, it sends from
inside its crossing: never a hole.

A library's pools are watched from the first run that starts after the library was
imported, so a process that never imports one pays nothing for it; a request of a run
that started before the import is still seen by the socket watch, since its connection is
new.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from agent_blackbox.outbox._context import crossing, current_run, in_crossing
from agent_blackbox.outbox._network import Hole, UnrecordedCall
from agent_blackbox.outbox._sites import agent_site

__all__ = ["watch_pools"]

_LIBRARIES = (("httpx2", "httpcore2"), ("httpx", "httpcore"))
"""Each HTTP client library, and the library of its connection pools."""
_LOCK = threading.Lock()
_watched: set[str] = set()


def watch_pools() -> None:
    """Watch the connection pools of the HTTP libraries imported so far (each once per
    process; a library imported later is watched from the next call on)."""
    for client, pools in _LIBRARIES:
        if pools in _watched or (client not in sys.modules and pools not in sys.modules):
            continue
        with _LOCK:
            if pools not in _watched:
                # The client library imports its pools' only when it makes its first
                # client, which may be inside this run: imported now, they are watched.
                _watch(importlib.import_module(pools))
                _watched.add(pools)


def _watch(module: Any) -> None:
    # Proxies (HTTPProxy, SOCKSProxy) are pools too: they inherit these two methods.
    sync_pool, async_pool = module.ConnectionPool, module.AsyncConnectionPool
    sync_pool.handle_request = _watched_sync(sync_pool.handle_request, module)
    async_pool.handle_async_request = _watched_async(async_pool.handle_async_request, module)


def _watched_sync(original: Callable[..., Any], module: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def handle_request(pool: Any, request: Any) -> Any:
        refusal = _checked(module, request)
        if refusal is not None:
            return refusal
        with crossing():  # reported already: its connection is not a second hole
            return original(pool, request)

    return handle_request


def _watched_async(original: Callable[..., Any], module: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    async def handle_async_request(pool: Any, request: Any) -> Any:
        refusal = _checked(module, request)
        if refusal is not None:
            return refusal
        with crossing():
            return await original(pool, request)

    return handle_async_request


def _checked(module: Any, request: Any) -> Any | None:
    """Report ``request`` as a hole of the run in force, if it is one; the library's
    refusal response when the run refuses it, else None (send it)."""
    if in_crossing():
        return None
    run = current_run()
    unrecorded = getattr(run, "unrecorded", None)
    if unrecorded is None:
        return None
    try:
        unrecorded(_hole(request))
    except UnrecordedCall as exc:
        return _refusal(module, exc)
    return None


def _hole(request: Any) -> Hole:
    origin = request.url.origin
    path = bytes(request.url.target).split(b"?", 1)[0].decode("ascii", "replace")
    what = f"{bytes(request.method).decode('ascii', 'replace')} {path}"
    agent, library = agent_site(sys._getframe(3))
    return Hole(bytes(origin.host).decode("ascii", "replace"), origin.port, what, agent, library)


def _refusal(module: Any, exc: UnrecordedCall) -> Any:
    body = {"error": {"type": "blackbox_error", "code": type(exc).__name__, "message": str(exc)}}
    headers = [(b"content-type", b"application/json"), (b"x-should-retry", b"false")]
    return module.Response(400, headers=headers, content=json.dumps(body).encode())
