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

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, TypeVar, overload

import httpx2
import openai
import pydantic
from openai._models import construct_type, validate_type  # how the SDK builds its objects
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from agent_blackbox.outbox._errors import RecordedError
from agent_blackbox.outbox._protocol import AgentRun
from agent_blackbox.schemas import NotSerialisable, canonical_text

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

# The API errors rebuilt in replay from their recorded status and body, by class name.
_STATUS_ERRORS: dict[str, type[openai.APIStatusError]] = {
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
}


class AsyncAgentRun(Protocol):
    """The boundary an async capture needs: :class:`~agent_blackbox.outbox.AsyncRun` in record mode,
    :class:`~agent_blackbox.replayer.AsyncReplayRun` in replay."""

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Awaitable[Mapping[str, Any]] | Mapping[str, Any]: ...


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


class RecordedStream(Generic[T]):
    """The chunks of a streamed call, in the order the server sent them.

    It iterates once, like the SDK's ``Stream``, and is a context manager; the HTTP
    response is already closed (or, in replay, never existed). :attr:`chunks` holds
    them all.
    """

    def __init__(self, chunks: Iterable[T]) -> None:
        self.chunks: tuple[T, ...] = tuple(chunks)
        self._iterator = iter(self.chunks)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return next(self._iterator)

    def __enter__(self) -> RecordedStream[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the iteration; nothing is left open."""
        self._iterator = iter(())


class AsyncRecordedStream(Generic[T]):
    """The async twin of :class:`RecordedStream`, iterated with ``async for``."""

    def __init__(self, chunks: Iterable[T]) -> None:
        self.chunks: tuple[T, ...] = tuple(chunks)
        self._iterator = iter(self.chunks)

    def __aiter__(self) -> AsyncRecordedStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return next(self._iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> AsyncRecordedStream[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the iteration; nothing is left open."""
        self._iterator = iter(())


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
        name: _json_value(value)
        for name, value in sent.items()
        if name not in _TRANSPORT_OPTIONS and not isinstance(value, openai.NotGiven | openai.Omit)
    }
    return sent, request


def _materialised(value: Any) -> Any:
    if isinstance(value, str | bytes | Mapping | Sequence | pydantic.BaseModel):
        return value
    return list(value) if isinstance(value, Iterable) else value


def _json_value(value: Any) -> Any:
    """``value`` as JSON; what is not JSON is left for the recorder to reject."""
    if isinstance(value, pydantic.BaseModel):
        # The SDK sends models this way; so the recorded request is the body it sent.
        exclude = getattr(value, "__api_exclude__", None)
        return value.model_dump(mode="json", exclude_unset=True, exclude=exclude)
    if isinstance(value, Mapping):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    return value


def _model(request: Mapping[str, Any]) -> str | None:
    model = request.get("model")
    return model if isinstance(model, str) else None


def _mark(exc: openai.APIError) -> None:
    """Make the recorded form of ``exc`` carry what replay needs to rebuild it."""
    status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
    details = {
        "message": exc.message,
        "status_code": status,
        "body": exc.body,
        "response_text": _response_text(exc),
    }
    try:
        message = canonical_text(details, path="openai.error")
    except NotSerialisable:
        return  # recorded by its type and message alone, and replayed as RecordedError
    # error_info() records this attribute instead of str(exc); see outbox._boundaries.
    exc.recorded_error = {"type": type(exc).__qualname__, "message": message}  # type: ignore[attr-defined]


def _response_text(exc: openai.APIError) -> str | None:
    if not isinstance(exc, openai.APIStatusError):
        return None
    try:
        return exc.response.text
    except httpx2.ResponseNotRead:
        return None


# What replay hands back -------------------------------------------------------------


def _rebuilt(
    endpoint: _Endpoint, response: Mapping[str, Any], *, streamed: bool, strict: bool
) -> Any:
    """The SDK objects of a recorded response: the chunks of a stream, or one result."""
    if streamed:
        return [_built(endpoint.chunk, chunk, strict=strict) for chunk in response["stream"]]
    return _built(endpoint.result, response, strict=strict)


def _handed_back(
    client: openai.OpenAI | openai.AsyncOpenAI,
    endpoint: _Endpoint,
    originals: list[Any],
    response: Mapping[str, Any],
    streamed: bool,
) -> Any:
    """The SDK's own objects in record mode, or, in replay, their rebuilt twins."""
    if originals:
        return originals[0]
    strict = bool(getattr(client, "_strict_response_validation", False))
    return _rebuilt(endpoint, response, streamed=streamed, strict=strict)


def _built(type_: Any, data: Any, *, strict: bool) -> Any:
    # The SDK builds its objects without validation unless the client asked for strict
    # validation; replay does the same, so an object is equal to the one record mode
    # handed back also where the server's JSON does not match the SDK's types.
    return (
        validate_type(type_=type_, value=data)
        if strict
        else construct_type(type_=type_, value=data)
    )


def _rebuilt_error(recorded: RecordedError, url: httpx2.URL) -> Exception | None:
    """The ``openai`` exception a recorded error stands for, or None for any other."""
    details = _details(recorded.message)
    if details is None:
        return None
    request = httpx2.Request("POST", url)
    message, body = str(details.get("message")), details.get("body")
    status, text = details.get("status_code"), details.get("response_text")
    cls = _STATUS_ERRORS.get(recorded.type_name)
    rebuilt: Exception
    if cls is not None and isinstance(status, int) and isinstance(text, str):
        headers = {"content-type": "application/json"}
        response = httpx2.Response(status, content=text.encode(), headers=headers, request=request)
        rebuilt = cls(message, response=response, body=body)
    elif recorded.type_name == "APITimeoutError":
        rebuilt = openai.APITimeoutError(request=request)
    elif recorded.type_name == "APIConnectionError":
        rebuilt = openai.APIConnectionError(message=message, request=request)
    elif recorded.type_name == "APIError":
        rebuilt = openai.APIError(message, request, body=body)
    else:
        return None
    # Recorded again the way it was recorded, should the agent's run end on it.
    rebuilt.recorded_error = dict(recorded.recorded_error)  # type: ignore[attr-defined]
    return rebuilt


def _details(message: str) -> dict[str, Any] | None:
    try:
        details = json.loads(message)
    except ValueError:
        return None
    return details if isinstance(details, dict) else None


# Sync ---------------------------------------------------------------------------------


class _SyncMethod:
    """``create`` of one endpoint of a sync client, through the run's boundary."""

    def __init__(self, client: openai.OpenAI, run: AgentRun, endpoint: _Endpoint) -> None:
        self._client = client
        self._run = run
        self._endpoint = endpoint
        resource = client.chat.completions if endpoint is _CHAT else client.responses
        # The raw-response variant, so the body is recorded exactly as the server sent it.
        self._raw_create: Callable[..., Any] = resource.with_raw_response.create

    def __call__(self, kwargs: Mapping[str, Any]) -> Any:
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))
        originals: list[Any] = []

        def send(_: Mapping[str, Any]) -> Mapping[str, Any]:
            try:
                raw = self._raw_create(**sent)
                if streamed:
                    with raw.parse() as stream:
                        chunks = list(stream)
                    originals.append(chunks)
                    return {"stream": [chunk.to_dict(mode="json") for chunk in chunks]}
                originals.append(raw.parse())
                body: Mapping[str, Any] = raw.http_response.json()
                return body
            except openai.APIError as exc:
                _mark(exc)
                raise

        try:
            response = self._run.llm(send, request, provider=PROVIDER, model=_model(request))
        except RecordedError as exc:
            rebuilt = _rebuilt_error(exc, self._client.base_url.join(self._endpoint.path))
            if rebuilt is None:
                raise
            raise rebuilt from exc
        result = _handed_back(self._client, self._endpoint, originals, response, streamed)
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


class _AsyncMethod:
    """``create`` of one endpoint of an async client, through the run's boundary."""

    def __init__(self, client: openai.AsyncOpenAI, run: AsyncAgentRun, endpoint: _Endpoint) -> None:
        self._client = client
        self._run = run
        self._endpoint = endpoint
        resource = client.chat.completions if endpoint is _CHAT else client.responses
        # The raw-response variant, so the body is recorded exactly as the server sent it.
        self._raw_create: Callable[..., Awaitable[Any]] = resource.with_raw_response.create

    async def __call__(self, kwargs: Mapping[str, Any]) -> Any:
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))
        originals: list[Any] = []

        async def send(_: Mapping[str, Any]) -> Mapping[str, Any]:
            try:
                raw = await self._raw_create(**sent)
                if streamed:
                    async with raw.parse() as stream:
                        chunks = [chunk async for chunk in stream]
                    originals.append(chunks)
                    return {"stream": [chunk.to_dict(mode="json") for chunk in chunks]}
                originals.append(raw.parse())
                body: Mapping[str, Any] = raw.http_response.json()
                return body
            except openai.APIError as exc:
                _mark(exc)
                raise

        try:
            answered = self._run.llm(send, request, provider=PROVIDER, model=_model(request))
            # A replay run answers at once; a recording run is awaited.
            response = await answered if inspect.isawaitable(answered) else answered
        except RecordedError as exc:
            rebuilt = _rebuilt_error(exc, self._client.base_url.join(self._endpoint.path))
            if rebuilt is None:
                raise
            raise rebuilt from exc
        result = _handed_back(self._client, self._endpoint, originals, response, streamed)
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
