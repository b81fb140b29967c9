"""HTTP clients whose requests go through the recording transports: a recording copy of
a client an SDK already has, or a new one to hand to an SDK or framework."""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar

import httpx2

from agent_blackbox.outbox.integrations.transport import (
    AsyncRecordingTransport,
    RecordingTransport,
)

__all__ = ["async_http_client", "http_client", "recording_client"]

C = TypeVar("C")


def _wrappers(http: Any) -> tuple[Any, bool]:
    """The recording transport class for ``http``'s library and kind, and whether the
    client is async.

    Raises:
        TypeError: ``http`` is not an ``httpx2`` or ``httpx`` client.
    """
    if isinstance(http, httpx2.Client):
        return RecordingTransport, False
    if isinstance(http, httpx2.AsyncClient):
        return AsyncRecordingTransport, True
    legacy = sys.modules.get("httpx")  # a client of httpx exists only once httpx is imported
    if legacy is not None and isinstance(http, legacy.Client | legacy.AsyncClient):
        from agent_blackbox.outbox.integrations._legacy import (
            LegacyAsyncRecordingTransport,
            LegacyRecordingTransport,
        )

        if isinstance(http, legacy.Client):
            return LegacyRecordingTransport, False
        return LegacyAsyncRecordingTransport, True
    raise TypeError(f"expected an httpx2 (or httpx) client, not {type(http).__name__}")


def _wrapped(http: C, run: Any, *, borrowed: bool) -> C:
    """``http`` with its transports (its own and its mounts') wrapped in recording ones;
    ``borrowed`` transports stay open when the wrappers close (their client owns them)."""
    wrapper, _ = _wrappers(http)
    target: Any = http

    def wrap(transport: Any) -> Any:
        recording = wrapper(transport, run=run)
        recording._owned = not borrowed
        return recording

    target._transport = wrap(target._transport)
    target._mounts = {
        pattern: None if inner is None else wrap(inner) for pattern, inner in target._mounts.items()
    }
    return http


def recording_client(http: C, *, run: Any = None) -> C:
    """A copy of the ``httpx2`` or ``httpx`` client ``http`` whose requests are recorded:
    the same settings and connection pool, its transports wrapped in recording ones.
    ``http`` itself is left as it was.

    Args:
        http: a sync or async client of either library.
        run: the run to record into; None for the run in force at each request.

    Raises:
        TypeError: ``http`` is not such a client.
    """
    return _wrapped(copy.copy(http), run, borrowed=True)


def http_client(*, run: Any = None, **options: Any) -> httpx2.Client:
    """A new ``httpx2.Client`` (``options`` are its own) that records the model calls sent
    through it; pass it as ``http_client=`` to an SDK or framework.

    Args:
        run: the run to record into; None (the usual) for the run in force at each
            request, so one client serves every run.
    """
    return _wrapped(httpx2.Client(**options), run, borrowed=False)


def async_http_client(*, run: Any = None, **options: Any) -> httpx2.AsyncClient:
    """The async twin of :func:`http_client`: a new ``httpx2.AsyncClient``."""
    return _wrapped(httpx2.AsyncClient(**options), run, borrowed=False)


def gone_client_name(module: str, name: str, gone: Mapping[str, str], *, capture: str) -> NoReturn:
    """What the capture ``module``'s ``__getattr__`` says of ``name``: the names of the
    capture at the SDK level, which wrapped the client, are ``gone`` (to what stands in
    for each now that ``capture`` gives back the SDK's own client).

    Raises:
        ImportError: ``name`` is gone (ImportError, not AttributeError: ``from ...
            import`` shows this message only then).
        AttributeError: ``module`` has no ``name`` and never had.
    """
    stands_in = gone.get(name)
    if stands_in is not None:
        raise ImportError(
            f"{module}.{name} is gone: {capture} returns the SDK's own client, and what it "
            f"hands back is the SDK's own type ({stands_in})"
        )
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
