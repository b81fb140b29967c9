"""Capture of the official ``openai`` SDK: the agent keeps calling the SDK, every call
crosses the run's ``llm.call`` boundary.

:func:`capture_openai` wraps an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client for
one run. ``chat.completions.create(...)`` and ``responses.create(...)`` take the SDK's
keyword arguments and hand back the SDK's objects, in record mode and in replay alike.

What is recorded (provider ``"openai"``, the model of the request):

- the request: the keyword arguments that make the JSON body, as JSON (SDK objects
  dumped the way the SDK sends them); ``extra_headers``, ``extra_query`` and
  ``timeout`` are transport options and are left out, and so are the client's API key,
  its headers, its base URL and anything else that is not the body. A value that is
  not JSON raises :class:`~agent_blackbox.schemas.NotSerialisable` before anything is sent;
- the response: the JSON body exactly as the server sent it. A streamed call
  (``stream=True``) is recorded as ``{"stream": [chunk, ...]}``, each chunk the JSON
  of one server-sent event as the SDK gives it back (``to_dict()``: the keys the
  server sent, under the names it sent them);
- an API error: its class name and, as the message, canonical JSON of the SDK's
  message, status code, error body and the response text; then it is re-raised.

Streams are read to their end inside ``create()``, so that the call is one event at the
point where the agent made it, in record and in replay; the agent then iterates the
chunks from memory (a :class:`RecordedStream`). Time to the first token is therefore
not what the agent sees while recording.

In replay nothing is sent: the objects are rebuilt from the recorded JSON the way the
SDK builds them (loosely constructed, or validated when the client was created with
strict response validation), so they compare equal to what record mode handed back. A
recorded API error is raised again as the same ``openai`` exception class, rebuilt from
the recorded status and body; only the classes listed here are rebuilt, chosen by the
recorded name, and nothing from a payload is imported or executed. Any other recorded
error comes back as faithful values do (its own class where it is imported and can be
rebuilt from its arguments, else a :class:`~agent_blackbox.outbox.RecordedError` subclass
named like it). The response's request id header
(``_request_id``) is not recorded and is ``None`` in replay.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar, overload

import httpx2
import openai
import pydantic
from openai._models import construct_type, validate_type  # how the SDK builds its objects
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from agent_blackbox.outbox._protocol import AgentRun
from agent_blackbox.outbox.integrations import _capture
from agent_blackbox.outbox.integrations._capture import AsyncAgentRun

__all__ = [
    "PROVIDER",
    "AsyncAgentRun",
    "AsyncRecordedStream",
    "CapturedAsyncOpenAI",
    "CapturedOpenAI",
    "RecordedStream",
    "capture_openai",
]

PROVIDER = "openai"
"""The provider name every captured call is recorded under."""

T = TypeVar("T")

# Options of the SDK that shape the HTTP exchange, not the JSON body. Headers may carry
# credentials, so none of them is ever recorded.
_TRANSPORT_OPTIONS = frozenset({"extra_headers", "extra_query", "timeout"})

_SDK = _capture.SDK(
    provider=PROVIDER,
    api_error=openai.APIError,
    status_error=openai.APIStatusError,
    timeout_error=openai.APITimeoutError,
    connection_error=openai.APIConnectionError,
    # The API errors rebuilt in replay from their recorded status and body, by class name.
    status_errors={
        cls.__name__: cls
        for cls in (
            openai.APIStatusError,
            openai.BadRequestError,
            openai.AuthenticationError,
            openai.PermissionDeniedError,
            openai.NotFoundError,
            openai.ConflictError,
            openai.UnprocessableEntityError,
            openai.RateLimitError,
            openai.InternalServerError,
        )
    },
    # The SDK reads an error response before raising, so a status error has its text.
    rebuilds_without_text=False,
    construct=construct_type,
    validate=validate_type,
)


@overload
def capture_openai(client: openai.AsyncOpenAI, run: AsyncAgentRun) -> CapturedAsyncOpenAI: ...


@overload
def capture_openai(client: openai.OpenAI, run: AgentRun) -> CapturedOpenAI: ...


def capture_openai(
    client: openai.OpenAI | openai.AsyncOpenAI, run: Any
) -> CapturedOpenAI | CapturedAsyncOpenAI:
    """Wrap ``client`` so its calls are recorded on ``run`` (or answered by it in replay).

    Args:
        client: an ``openai.OpenAI`` or ``openai.AsyncOpenAI``. In replay it is never
            used to send anything; a client without credentials and an unreachable base
            URL is fine.
        run: the run the calls belong to: a record-mode run (``Run`` for a sync client,
            ``AsyncRun`` for an async one) or a ``ReplayRun``.

    Returns:
        An object with ``chat.completions.create`` and ``responses.create``.

    Raises:
        TypeError: ``client`` is not an OpenAI SDK client.
    """
    if isinstance(client, openai.AsyncOpenAI):
        return CapturedAsyncOpenAI(client, run)
    if isinstance(client, openai.OpenAI):
        return CapturedOpenAI(client, run)
    raise TypeError(f"capture_openai wraps openai.OpenAI or openai.AsyncOpenAI, not {client!r}")


# Recorded streams --------------------------------------------------------------------


class RecordedStream(_capture.RecordedStream[T]):
    """The chunks of a streamed call, in the order the server sent them.

    It iterates once, like the SDK's ``Stream``, and is a context manager; the HTTP
    response is already closed (or, in replay, never existed). :attr:`chunks` holds
    them all.
    """

    def __init__(self, chunks: Iterable[T]) -> None:
        self.chunks: tuple[T, ...] = tuple(chunks)
        super().__init__(self.chunks)


class AsyncRecordedStream(_capture.AsyncRecordedStream[T]):
    """The async twin of :class:`RecordedStream`, iterated with ``async for``."""

    def __init__(self, chunks: Iterable[T]) -> None:
        self.chunks: tuple[T, ...] = tuple(chunks)
        super().__init__(self.chunks)


# What is recorded -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """One captured SDK method: where it posts and what it returns."""

    path: str
    result: type[pydantic.BaseModel]
    chunk: Any
    """The type of one streamed event (a model class or an annotated union)."""


_CHAT = _Endpoint("chat/completions", ChatCompletion, ChatCompletionChunk)
_RESPONSES = _Endpoint("responses", Response, ResponseStreamEvent)


def _prepared(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments to send, and the request JSON to record.

    Iterators among the arguments (the SDK takes any iterable of messages) are read
    into lists once, so that what is recorded is what is sent.
    """
    sent = {name: _materialised(value) for name, value in kwargs.items()}
    request = {
        name: _capture.json_value(value)
        for name, value in sent.items()
        if name not in _TRANSPORT_OPTIONS and not isinstance(value, openai.NotGiven | openai.Omit)
    }
    return sent, request


def _materialised(value: Any) -> Any:
    if isinstance(value, str | bytes | Mapping | Sequence | pydantic.BaseModel):
        return value
    return list(value) if isinstance(value, Iterable) else value


def _whole(raw: Any) -> _capture.Sent[Any]:
    """A plain call's answer: the SDK's object, and the body exactly as the server sent it."""
    return raw.parse(), raw.http_response.json()


def _streamed(chunks: list[Any]) -> _capture.Sent[Any]:
    return chunks, _capture.stream_json(chunks)


# What replay hands back -------------------------------------------------------------


def _rebuilt(
    endpoint: _Endpoint, response: Mapping[str, Any], *, streamed: bool, strict: bool
) -> Any:
    """The SDK objects of a recorded response: the chunks of a stream, or one result."""
    if streamed:
        return [_SDK.built(endpoint.chunk, chunk, strict=strict) for chunk in response["stream"]]
    return _SDK.built(endpoint.result, response, strict=strict)


class _Method:
    """What the sync and the async ``create`` of one endpoint share: the client, the run
    and where the endpoint posts."""

    def __init__(
        self, client: openai.OpenAI | openai.AsyncOpenAI, run: Any, endpoint: _Endpoint
    ) -> None:
        self._client = client
        self._run = run
        self._endpoint = endpoint

    def _replayed(self, response: Mapping[str, Any], *, streamed: bool) -> Any:
        strict = _capture.strict_validation(self._client)
        return _rebuilt(self._endpoint, response, streamed=streamed, strict=strict)

    def _url(self) -> httpx2.URL:
        return self._client.base_url.join(self._endpoint.path)


# Sync ---------------------------------------------------------------------------------


class _SyncMethod(_Method):
    """``create`` of one endpoint of a sync client, through the run's boundary."""

    def __init__(self, client: openai.OpenAI, run: AgentRun, endpoint: _Endpoint) -> None:
        super().__init__(client, run, endpoint)
        resource = client.chat.completions if endpoint is _CHAT else client.responses
        # The raw-response variant, so the body is recorded exactly as the server sent it.
        self._raw_create: Callable[..., Any] = resource.with_raw_response.create

    def __call__(self, kwargs: Mapping[str, Any]) -> Any:
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))

        def send() -> _capture.Sent[Any]:
            raw = self._raw_create(**sent)
            if not streamed:
                return _whole(raw)
            with raw.parse() as stream:
                chunks = list(stream)
            return _streamed(chunks)

        replayed = partial(self._replayed, streamed=streamed)
        result = _capture.recorded_call(
            _SDK, self._run, request, send=send, replayed=replayed, url=self._url
        )
        return RecordedStream(result) if streamed else result


class _ChatCompletions:
    def __init__(self, method: _SyncMethod) -> None:
        self._method = method

    @overload
    def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> RecordedStream[ChatCompletionChunk]: ...

    @overload
    def create(self, *, stream: Literal[False] | None = ..., **kwargs: Any) -> ChatCompletion: ...

    def create(self, **kwargs: Any) -> ChatCompletion | RecordedStream[ChatCompletionChunk]:
        """``client.chat.completions.create`` with the same arguments, recorded."""
        result: ChatCompletion | RecordedStream[ChatCompletionChunk] = self._method(kwargs)
        return result


class _Chat:
    def __init__(self, completions: _ChatCompletions) -> None:
        self.completions = completions


class _Responses:
    def __init__(self, method: _SyncMethod) -> None:
        self._method = method

    @overload
    def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> RecordedStream[ResponseStreamEvent]: ...

    @overload
    def create(self, *, stream: Literal[False] | None = ..., **kwargs: Any) -> Response: ...

    def create(self, **kwargs: Any) -> Response | RecordedStream[ResponseStreamEvent]:
        """``client.responses.create`` with the same arguments, recorded."""
        result: Response | RecordedStream[ResponseStreamEvent] = self._method(kwargs)
        return result


class CapturedOpenAI:
    """A sync OpenAI client whose model calls cross the run's ``llm.call`` boundary.

    Only ``chat.completions.create`` and ``responses.create`` are offered: any other
    endpoint would reach outside the run unrecorded, so it is not reachable from here.
    """

    def __init__(self, client: openai.OpenAI, run: AgentRun) -> None:
        self.client = client
        """The wrapped SDK client."""
        self.run = run
        self.chat = _Chat(_ChatCompletions(_SyncMethod(client, run, _CHAT)))
        self.responses = _Responses(_SyncMethod(client, run, _RESPONSES))

    def with_options(self, **options: Any) -> CapturedOpenAI:
        """``client.with_options(...)``, captured on the same run."""
        return CapturedOpenAI(self.client.with_options(**options), self.run)


# Async --------------------------------------------------------------------------------


class _AsyncMethod(_Method):
    """``create`` of one endpoint of an async client, through the run's boundary."""

    def __init__(self, client: openai.AsyncOpenAI, run: AsyncAgentRun, endpoint: _Endpoint) -> None:
        super().__init__(client, run, endpoint)
        resource = client.chat.completions if endpoint is _CHAT else client.responses
        # The raw-response variant, so the body is recorded exactly as the server sent it.
        self._raw_create: Callable[..., Awaitable[Any]] = resource.with_raw_response.create

    async def __call__(self, kwargs: Mapping[str, Any]) -> Any:
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))

        async def send() -> _capture.Sent[Any]:
            raw = await self._raw_create(**sent)
            if not streamed:
                return _whole(raw)
            async with raw.parse() as stream:
                chunks = [chunk async for chunk in stream]
            return _streamed(chunks)

        replayed = partial(self._replayed, streamed=streamed)
        result = await _capture.recorded_call_async(
            _SDK, self._run, request, send=send, replayed=replayed, url=self._url
        )
        return AsyncRecordedStream(result) if streamed else result


class _AsyncChatCompletions:
    def __init__(self, method: _AsyncMethod) -> None:
        self._method = method

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> AsyncRecordedStream[ChatCompletionChunk]: ...

    @overload
    async def create(
        self, *, stream: Literal[False] | None = ..., **kwargs: Any
    ) -> ChatCompletion: ...

    async def create(
        self, **kwargs: Any
    ) -> ChatCompletion | AsyncRecordedStream[ChatCompletionChunk]:
        """``await client.chat.completions.create`` with the same arguments, recorded."""
        result: ChatCompletion | AsyncRecordedStream[ChatCompletionChunk] = await self._method(
            kwargs
        )
        return result


class _AsyncChat:
    def __init__(self, completions: _AsyncChatCompletions) -> None:
        self.completions = completions


class _AsyncResponses:
    def __init__(self, method: _AsyncMethod) -> None:
        self._method = method

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> AsyncRecordedStream[ResponseStreamEvent]: ...

    @overload
    async def create(self, *, stream: Literal[False] | None = ..., **kwargs: Any) -> Response: ...

    async def create(self, **kwargs: Any) -> Response | AsyncRecordedStream[ResponseStreamEvent]:
        """``await client.responses.create`` with the same arguments, recorded."""
        result: Response | AsyncRecordedStream[ResponseStreamEvent] = await self._method(kwargs)
        return result


class CapturedAsyncOpenAI:
    """The async twin of :class:`CapturedOpenAI`, for ``openai.AsyncOpenAI``."""

    def __init__(self, client: openai.AsyncOpenAI, run: AsyncAgentRun) -> None:
        self.client = client
        """The wrapped SDK client."""
        self.run = run
        self.chat = _AsyncChat(_AsyncChatCompletions(_AsyncMethod(client, run, _CHAT)))
        self.responses = _AsyncResponses(_AsyncMethod(client, run, _RESPONSES))

    def with_options(self, **options: Any) -> CapturedAsyncOpenAI:
        """``client.with_options(...)``, captured on the same run."""
        return CapturedAsyncOpenAI(self.client.with_options(**options), self.run)
