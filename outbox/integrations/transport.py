"""Recording at the HTTP transport: every model call an SDK or framework makes through a
client built on one of these crosses the run's ``llm.call`` boundary.

:class:`RecordingTransport` and :class:`AsyncRecordingTransport` are ``httpx2``
transports (the HTTP library of the ``openai`` and ``anthropic`` SDKs) that wrap another
(the default one when none is given). Give one to any client that takes an
``http_client``::

    client = openai.OpenAI(http_client=httpx2.Client(transport=RecordingTransport()))

The run a call belongs to is the run in force in the calling task or thread (see
:func:`~agent_blackbox.outbox.current_run`), or the run the transport was made for. Which
requests are model calls, and what is recorded of them, is said in ``_http.py``: in
short, the JSON body as sent and the answer as received, never a header, URL or key.

In record mode the request goes out and the answer comes back untouched: a streamed
answer reaches the agent chunk by chunk as it arrives, while the transport keeps a copy
and records the call when the stream ends (or is closed). In replay nothing goes out: the
recorded answer comes back as an HTTP response the client reads as it read the original
(the stream's events, an error status with its body and headers, a transport error of
the same class), so the SDK builds the same objects and raises the same exceptions.

Requests that are not model calls (``GET /v1/models``, a file upload) are not recorded:
inside a run they are holes, reported on the run while recording and refused in replay.
Outside any run everything passes through; model calls are counted
(``blackbox_unrecorded_llm_requests_total``). Inside a crossing (a tool's own work, or
another recording transport's call) everything passes through: it is that crossing's.

A problem of the recorder's that is found before anything is sent (the run finished, a
request that cannot be recorded, a divergence or setup error in replay) is answered with
a ``400`` whose JSON error says what was wrong and whose ``x-should-retry: false`` keeps
the SDKs from trying again; one found after the answer came (the database is down) is
raised at the run's next boundary, so that no SDK retries a call the model already
answered.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2

from agent_blackbox.outbox._context import crossing, current_run, in_crossing
from agent_blackbox.outbox._errors import RecordedError
from agent_blackbox.outbox._metrics import unrecorded_llm_requests
from agent_blackbox.outbox._network import Hole, UnrecordedCall
from agent_blackbox.outbox._sites import agent_site
from agent_blackbox.outbox.integrations._http import (
    Endpoint,
    ProviderError,
    endpoint_of,
    error_answer,
    recorded_answer,
    replayed_body,
    request_json,
)
from agent_blackbox.schemas import BlackboxError

__all__ = ["AsyncRecordingTransport", "Kit", "RecordingTransport"]

_DROPPED_HEADERS = ("content-encoding", "content-length", "transfer-encoding")
"""Headers of the response the transport no longer sends as such: the body it hands on
is already decoded, and its length is the decoded one."""

_OLD_SDK_ERRORS = {"APITimeoutError": "ReadTimeout", "APIConnectionError": "ConnectError"}
"""Transport errors an SDK-level capture recorded under the SDK's names."""


@dataclass(frozen=True, slots=True)
class Kit:
    """The HTTP library a transport works with (``httpx2``, or ``httpx`` for clients of
    the earlier library): its response class, its stream base classes (the tee streams
    built on them) and its transport errors."""

    module: Any
    response: Any
    sync_tee: Any
    async_tee: Any

    def transport_error(self, name: str) -> Any:
        """The library's transport error class of that name (it takes a message and the
        request), or None."""
        cls = getattr(self.module, name, None) if name in self.module.__all__ else None
        base = self.module.TransportError
        return cls if isinstance(cls, type) and issubclass(cls, base) else None


# What each call is ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    """A model call a request makes: its API and its recorded request."""

    endpoint: Endpoint
    request: dict[str, Any]

    @property
    def model(self) -> str | None:
        model = self.request.get("model")
        return model if isinstance(model, str) else None


def _call_of(request: Any, body: bytes) -> _Call | None:
    endpoint = endpoint_of(request.method, request.url.path, request.headers)
    found = request_json(body) if endpoint is not None else None
    return None if endpoint is None or found is None else _Call(endpoint, found)


def _provider_of(request: Any) -> str | None:
    endpoint = endpoint_of(request.method, request.url.path, request.headers)
    return None if endpoint is None else endpoint.provider


def _hole(request: Any) -> Hole:
    agent, library = agent_site(sys._getframe(2))
    url = request.url
    return Hole(url.host, url.port, f"{request.method} {url.path}", agent, library)


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


# Answers the transport makes itself -----------------------------------------------------


_REPLAYED = {"http_version": b"replayed"}
"""The protocol a replayed answer says it came by: HTTP clients log it (``HTTP Request:
POST ... "replayed 200 OK"``), so a log of a replay does not read as calls that went out."""
_REFUSED = {"http_version": b"refused"}
"""Likewise for an answer the recorder gave instead of sending (``"refused 400 ..."``)."""


def refused(kit: Kit, request: Any, exc: BaseException) -> Any:
    """The answer to a call the recorder stopped before anything was sent: a ``400``
    that says why, which the SDKs do not retry."""
    body = {"error": {"type": "blackbox_error", "code": type(exc).__name__, "message": str(exc)}}
    headers = {"content-type": "application/json", "x-should-retry": "false"}
    content = json.dumps(body).encode()
    return kit.response(400, headers=headers, content=content, request=request, extensions=_REFUSED)


def _replayed(kit: Kit, request: Any, call: _Call, answer: Mapping[str, Any]) -> Any:
    content_type, content = replayed_body(call.endpoint, answer)
    headers = {"content-type": content_type}
    return kit.response(
        200, headers=headers, content=content, request=request, extensions=_REPLAYED
    )


def _recorded_failure(kit: Kit, request: Any, exc: RecordedError) -> Any:
    """The HTTP error a recorded error stands for, or the transport error raised again."""
    answer = error_answer(exc.message)
    if answer is not None:
        return kit.response(
            answer.status,
            headers=answer.headers,
            content=answer.content,
            request=request,
            extensions=_REPLAYED,
        )
    cls = kit.transport_error(_OLD_SDK_ERRORS.get(exc.type_name, exc.type_name))
    if cls is None:
        raise exc
    raise cls(exc.message, request=request) from exc


def _handed_on(
    kit: Kit, request: Any, response: Any, *, content: bytes | None = None, stream: Any = None
) -> Any:
    """``response`` as the client gets it: decoded body, same status and headers."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k not in _DROPPED_HEADERS]
    return kit.response(
        response.status_code,
        headers=headers,
        content=content,
        stream=stream,
        request=request,
        extensions=response.extensions,
    )


def _is_stream(response: Any) -> bool:
    content_type = str(response.headers.get("content-type", ""))
    return response.status_code < 400 and content_type.startswith("text/event-stream")


def _answer(response: Any, text: str) -> tuple[Mapping[str, Any] | None, ProviderError | None]:
    content_type = str(response.headers.get("content-type", ""))
    try:
        return recorded_answer(response.status_code, content_type, text, response.headers), None
    except ProviderError as exc:
        return None, exc


def _defer(run: Any, exc: BaseException) -> None:
    """A recording failure after the answer came: raised at the run's next boundary
    (raised here, the SDK would send the call again)."""
    core = run.core
    if core.unreported is None:
        core.unreported = exc


def _text(content: bytes) -> str:
    return content.decode("utf-8", errors="replace")


# Streams read by the agent as they arrive --------------------------------------------


class _Tee:
    """What the sync and async tee streams share: the bytes read so far, and recording
    the call once, when the stream ends or is closed. The body is read from the server
    once, however often the client iterates (an SDK may iterate again to drain it)."""

    def __init__(self, response: Any, settle: Callable[[str, BaseException | None], Any]) -> None:
        self._response = response
        self._settle = settle
        self._chunks: list[bytes] = []
        self._settled = False

    def _kept(self, chunk: bytes) -> bytes:
        self._chunks.append(chunk)
        return chunk

    def _end(self, error: BaseException | None) -> Any:
        if self._settled:
            return None
        self._settled = True
        return self._settle(_text(b"".join(self._chunks)), error)


class SyncTee(_Tee, httpx2.SyncByteStream):
    """The body of a streamed answer, handed on chunk by chunk as it arrives."""

    _source: Iterator[bytes] | None = None

    def __iter__(self) -> Iterator[bytes]:
        if self._source is None:
            self._source = self._response.iter_bytes()
        try:
            for chunk in self._source:
                yield self._kept(chunk)
        except Exception as exc:
            self._end(exc)
            raise
        self._end(None)

    def close(self) -> None:
        try:
            self._response.close()
        finally:
            self._end(None)  # closed early: what was read is what the agent saw


class AsyncTee(_Tee, httpx2.AsyncByteStream):
    """The async twin of :class:`SyncTee`.

    The call is recorded in a task of its own, which the stream's end and its closing
    both wait for: whoever reads the stream may read it under a deadline (the openai SDK
    drains the rest of a finished stream within 0.1 s), and a deadline that passes while
    the event is being appended must cancel the waiting, never the appending (the call
    was lost when the database took longer). Closing waits for it again, so the agent
    goes on only once the call is recorded.
    """

    _source: AsyncIterator[bytes] | None = None
    _recording: asyncio.Future[Any] | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._source is None:
            self._source = self._response.aiter_bytes()
        try:
            async for chunk in self._source:
                yield self._kept(chunk)
        except Exception as exc:
            await self._recorded(exc)
            raise
        await self._recorded(None)

    async def aclose(self) -> None:
        try:
            await self._response.aclose()
        finally:
            await self._recorded(None)

    async def _recorded(self, error: BaseException | None) -> None:
        """Record the call, once, and wait until it is."""
        if self._recording is None:
            work = self._end(error)
            if not isinstance(work, Awaitable):
                return
            if asyncio.events._get_running_loop() is None:  # not asyncio (trio): no tasks
                await work
                return
            self._recording = asyncio.ensure_future(work)
        await asyncio.shield(self._recording)


async def _maybe(result: Any) -> Any:
    return await result if isinstance(result, Awaitable) else result


HTTPX2 = Kit(httpx2, httpx2.Response, SyncTee, AsyncTee)


# Sync -------------------------------------------------------------------------------------


def handle(kit: Kit, send: Callable[[Any], Any], request: Any, run: Any = None) -> Any:
    """One request through a sync recording transport; ``send`` sends it on."""
    if in_crossing():
        return send(request)
    run = run if run is not None else current_run()
    if run is None:
        provider = _provider_of(request)
        if provider is not None:
            unrecorded_llm_requests().labels(provider).inc()
        return send(request)
    call = _call_of(request, request.read())
    if call is None:
        return _passed_hole(kit, send, request, run)
    if _on_its_loop(run):
        return refused(kit, request, SyncClientOnLoop())
    if getattr(run, "replaying", False):
        return _replay(kit, request, call, getattr(run, "replay", run))
    if isinstance(getattr(run, "loop", None), asyncio.AbstractEventLoop):
        return _record_through_loop(kit, send, request, call, run)
    try:
        opened = run.open_llm(call.request, provider=call.endpoint.provider, model=call.model)
    except BlackboxError as exc:
        return refused(kit, request, exc)
    return _record(kit, send, request, run, opened.close)


def _passed_hole(kit: Kit, send: Callable[[Any], Any], request: Any, run: Any) -> Any:
    """A request inside a run that is not a model call: reported, or refused."""
    try:
        run.unrecorded(_hole(request))
    except UnrecordedCall as exc:
        return refused(kit, request, exc)
    with crossing():  # reported here already; its connection is not a second hole
        return send(request)


def _replay(kit: Kit, request: Any, call: _Call, run: Any) -> Any:
    try:
        answer = run.llm(_not_sent, call.request, provider=call.endpoint.provider, model=call.model)
    except RecordedError as exc:
        return _recorded_failure(kit, request, exc)
    except BlackboxError as exc:  # a divergence or setup error: the replay reports it
        return refused(kit, request, exc)
    return _replayed(kit, request, call, answer)


def _not_sent(request: Mapping[str, Any]) -> Mapping[str, Any]:
    raise AssertionError("replay never sends a request")  # pragma: no cover


def _record(
    kit: Kit, send: Callable[[Any], Any], request: Any, run: Any, close: Callable[..., Any]
) -> Any:
    """Send the request and record the call: at once, or when its stream ends."""
    started = time.perf_counter()
    try:
        with crossing():
            response = send(request)
    except Exception as exc:
        _settled(run, close, None, exc, started)
        raise
    if _is_stream(response):

        def settle(text: str, error: BaseException | None) -> None:
            answer, failure = _answer(response, text)
            _settled(run, close, answer, error or failure, started)

        return _handed_on(kit, request, response, stream=kit.sync_tee(response, settle))
    content = response.read()
    response.close()
    answer, failure = _answer(response, _text(content))
    _settled(run, close, answer, failure, started)
    return _handed_on(kit, request, response, content=content)


def _settled(
    run: Any,
    close: Callable[..., Any],
    answer: Mapping[str, Any] | None,
    error: BaseException | None,
    started: float,
) -> None:
    """Record how the call ended; the client gets what the server said either way."""
    try:
        close(answer, error=error, latency_ms=_since(started))
    except BlackboxError as exc:
        if exc is not error:
            _defer(run, exc)
    except Exception as exc:
        if exc is not error:
            raise


def _record_through_loop(
    kit: Kit, send: Callable[[Any], Any], request: Any, call: _Call, run: Any
) -> Any:
    """A sync client inside an async run, called from another thread than the run's
    loop (a framework's executor): the call is recorded through the loop."""
    loop: asyncio.AbstractEventLoop = run.loop
    try:
        opened = run.open_llm(call.request, provider=call.endpoint.provider, model=call.model)
    except BlackboxError as exc:
        return refused(kit, request, exc)

    def close(answer: Any, *, error: BaseException | None, latency_ms: float) -> Any:
        work = opened.close(answer, error=error, latency_ms=latency_ms)
        return asyncio.run_coroutine_threadsafe(work, loop).result()

    return _record(kit, send, request, run, close)


def _on_its_loop(run: Any) -> bool:
    """Whether a sync client is called on the event loop of an async run: refused in
    record mode (recording would block the loop), and so in replay too, where the run
    replays on the loop that drives the entry."""
    running = asyncio.events._get_running_loop()
    if running is None:
        return False
    loop = getattr(run, "loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop):
        return running is loop
    return bool(getattr(run, "replaying", False)) and inspect.iscoroutinefunction(run.llm)


class SyncClientOnLoop(BlackboxError):
    """A sync model client was called on the event loop of an async run."""

    def __init__(self) -> None:
        super().__init__(
            "a sync model client was called inside an async run, on its event loop: the "
            "call cannot be recorded without blocking the loop. Use the async client "
            "(openai.AsyncOpenAI, anthropic.AsyncAnthropic), or call the sync one in a "
            "thread (asyncio.to_thread)"
        )


class RecordingTransport(httpx2.BaseTransport):
    """An ``httpx2`` transport that records the model calls sent through it.

    Args:
        transport: the transport that sends requests on (a default
            ``httpx2.HTTPTransport`` when None; it is then closed with this one).
        run: the run to record into; when None, the run in force where each request is
            made (see :func:`~agent_blackbox.outbox.current_run`).
    """

    def __init__(self, transport: httpx2.BaseTransport | None = None, *, run: Any = None) -> None:
        self._owned = transport is None
        self.transport = transport if transport is not None else httpx2.HTTPTransport()
        self.run = run

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = handle(HTTPX2, self.transport.handle_request, request, self.run)
        return response

    def close(self) -> None:
        if self._owned:
            self.transport.close()


# Async ------------------------------------------------------------------------------------


async def handle_async(
    kit: Kit, send: Callable[[Any], Awaitable[Any]], request: Any, run: Any = None
) -> Any:
    """One request through an async recording transport; see :func:`handle`."""
    if in_crossing():
        return await send(request)
    run = run if run is not None else current_run()
    if run is None:
        provider = _provider_of(request)
        if provider is not None:
            unrecorded_llm_requests().labels(provider).inc()
        return await send(request)
    call = _call_of(request, await request.aread())
    if call is None:
        return await _passed_hole_async(kit, send, request, run)
    if getattr(run, "replaying", False):
        return await _replay_async(kit, request, call, run)
    try:
        opened = run.open_llm(call.request, provider=call.endpoint.provider, model=call.model)
    except BlackboxError as exc:
        return refused(kit, request, exc)
    return await _record_async(kit, send, request, run, opened.close)


async def _passed_hole_async(
    kit: Kit, send: Callable[[Any], Awaitable[Any]], request: Any, run: Any
) -> Any:
    try:
        run.unrecorded(_hole(request))
    except UnrecordedCall as exc:
        return refused(kit, request, exc)
    with crossing():
        return await send(request)


async def _replay_async(kit: Kit, request: Any, call: _Call, run: Any) -> Any:
    try:
        asked = run.llm(_not_sent, call.request, provider=call.endpoint.provider, model=call.model)
        answer = await _maybe(asked)  # an async replay run awaits its turn
    except RecordedError as exc:
        return _recorded_failure(kit, request, exc)
    except BlackboxError as exc:
        return refused(kit, request, exc)
    return _replayed(kit, request, call, answer)


async def _record_async(
    kit: Kit,
    send: Callable[[Any], Awaitable[Any]],
    request: Any,
    run: Any,
    close: Callable[..., Any],
) -> Any:
    started = time.perf_counter()
    try:
        with crossing():
            response = await send(request)
    except Exception as exc:
        await _settled_async(run, close, None, exc, started)
        raise
    if _is_stream(response):

        async def settle(text: str, error: BaseException | None) -> None:
            answer, failure = _answer(response, text)
            await _settled_async(run, close, answer, error or failure, started)

        return _handed_on(kit, request, response, stream=kit.async_tee(response, settle))
    content = await response.aread()
    await response.aclose()
    answer, failure = _answer(response, _text(content))
    await _settled_async(run, close, answer, failure, started)
    return _handed_on(kit, request, response, content=content)


async def _settled_async(
    run: Any,
    close: Callable[..., Any],
    answer: Mapping[str, Any] | None,
    error: BaseException | None,
    started: float,
) -> None:
    """:func:`_settled` for an async run (whose close is awaited) or a sync one."""
    try:
        await _maybe(close(answer, error=error, latency_ms=_since(started)))
    except BlackboxError as exc:
        if exc is not error:
            _defer(run, exc)
    except Exception as exc:
        if exc is not error:
            raise


class AsyncRecordingTransport(httpx2.AsyncBaseTransport):
    """The async twin of :class:`RecordingTransport`, for ``httpx2.AsyncClient``."""

    def __init__(
        self, transport: httpx2.AsyncBaseTransport | None = None, *, run: Any = None
    ) -> None:
        self._owned = transport is None
        self.transport = transport if transport is not None else httpx2.AsyncHTTPTransport()
        self.run = run

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = await handle_async(
            HTTPX2, self.transport.handle_async_request, request, self.run
        )
        return response

    async def aclose(self) -> None:
        if self._owned:
            await self.transport.aclose()
