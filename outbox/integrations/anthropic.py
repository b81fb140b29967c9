"""Capture of the official ``anthropic`` SDK: the agent keeps calling the SDK, every
Messages API call crosses the run's ``llm.call`` boundary.

:func:`capture_anthropic` wraps an ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic``
client for one run. ``messages.create(...)`` (plain, with tools, or ``stream=True``) and
``messages.stream(...)`` take the SDK's keyword arguments and hand back the SDK's objects,
in record mode and in replay alike.

Recorded, under provider ``"anthropic"``: the keyword arguments that make the JSON body
(SDK objects dumped as the SDK sends them, ``extra_body`` merged in); never
``extra_headers``, ``extra_query``, ``timeout``, the arguments sent as headers
(``user_profile_id``, ``workspace_id``), the client's key or auth token, its default
headers or its base URL. A value that is not JSON raises
:class:`~agent_blackbox.schemas.NotSerialisable` before anything is sent. The response
is recorded as the server sent it; a stream as ``{"stream": [event, ...]}``, each event
as the SDK parsed it (``to_dict()``: the keys the server sent; ``ping`` is dropped by
the SDK). An API error is recorded by class name with canonical JSON of its message,
status, body and response text, and re-raised. The body's summary fields (usage, finish
reason, tool calls) are read from the Anthropic JSON by the schemas' views
(``completion_view``, ``anthropic_usage``).

Streams are read to their end inside the call, so that the call is one event where the
agent made it, in record and in replay: ``create(stream=True)`` gives a
:class:`RecordedStream` of the raw events; ``messages.stream(...)`` gives a manager that,
when entered, makes the call and gives the SDK's own ``MessageStream`` (or
``AsyncMessageStream``) reading the recorded events, so iteration, ``text_stream``,
``get_final_message()``, ``get_final_text()`` and ``until_done()`` are the SDK's.
``output_format`` is refused (pass the schema as ``output_config``).

In replay nothing is sent: ``Message`` and the events are rebuilt from the recorded JSON
as the SDK builds them (validated when the client asked for strict validation), so they
compare equal to what record mode handed back. A recorded API error is raised again as
the same ``anthropic`` class, chosen by its recorded name among the SDK's status error
classes only; nothing from a payload is imported. Any other recorded error comes back as
faithful values do. Request ids are not recorded and are ``None`` in replay.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import date
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, TypeVar, cast, overload

import anthropic
import httpx2
import pydantic
from anthropic._models import construct_type, validate_type  # how the SDK builds its objects
from anthropic.lib.streaming import AsyncMessageStream, MessageStream
from anthropic.types import Message, RawMessageStreamEvent

from agent_blackbox.outbox._errors import RecordedError
from agent_blackbox.outbox._protocol import AgentRun
from agent_blackbox.schemas import NotSerialisable, canonical_text

__all__ = [
    "PROVIDER",
    "AsyncAgentRun",
    "AsyncRecordedMessageStreamManager",
    "AsyncRecordedStream",
    "CapturedAnthropic",
    "CapturedAsyncAnthropic",
    "RecordedMessageStreamManager",
    "RecordedStream",
    "capture_anthropic",
]

PROVIDER = "anthropic"
"""The provider name every captured call is recorded under."""

T = TypeVar("T")

# Arguments of the SDK that shape the HTTP exchange, not the JSON body. Headers may carry
# credentials, so none of them is ever recorded; extra_body is merged into the body.
_NOT_BODY = frozenset(
    {"extra_headers", "extra_query", "extra_body", "timeout", "user_profile_id", "workspace_id"}
)

_PATH = "v1/messages"


def _status_errors() -> dict[str, type[anthropic.APIStatusError]]:
    """The API errors rebuilt in replay, by class name: the status errors the SDK
    exports, and the classes its own table picks for a status and an error code."""
    exported = [getattr(anthropic, name) for name in anthropic.__all__]
    classes = [
        c for c in exported if isinstance(c, type) and issubclass(c, anthropic.APIStatusError)
    ]
    try:
        from anthropic._error_classes import ERROR_CLASSES
    except ImportError:  # an SDK without the table: the exported classes
        pass
    else:
        classes += ERROR_CLASSES.values()
    return {cls.__name__: cls for cls in classes}


_STATUS_ERRORS = _status_errors()


class AsyncAgentRun(Protocol):
    """The boundary an async capture needs: :class:`~agent_blackbox.outbox.AsyncRun` in
    record mode, :class:`~agent_blackbox.replayer.AsyncReplayRun` in replay."""

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Awaitable[Mapping[str, Any]] | Mapping[str, Any]: ...


@overload
def capture_anthropic(
    client: anthropic.AsyncAnthropic, run: AsyncAgentRun
) -> CapturedAsyncAnthropic: ...


@overload
def capture_anthropic(client: anthropic.Anthropic, run: AgentRun) -> CapturedAnthropic: ...


def capture_anthropic(
    client: anthropic.Anthropic | anthropic.AsyncAnthropic, run: Any
) -> CapturedAnthropic | CapturedAsyncAnthropic:
    """Wrap ``client`` so its Messages API calls are recorded on ``run`` (or answered by
    it in replay).

    Args:
        client: an ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic``. In replay it
            is never used to send anything; a client without credentials and an
            unreachable base URL is fine.
        run: the run the calls belong to: a record-mode run (``Run`` for a sync client,
            ``AsyncRun`` for an async one) or a ``ReplayRun``.

    Returns:
        An object with ``messages.create`` and ``messages.stream``.

    Raises:
        TypeError: ``client`` is not an Anthropic SDK client.
    """
    if isinstance(client, anthropic.AsyncAnthropic):
        return CapturedAsyncAnthropic(client, run)
    if isinstance(client, anthropic.Anthropic):
        return CapturedAnthropic(client, run)
    raise TypeError(
        f"capture_anthropic wraps anthropic.Anthropic or anthropic.AsyncAnthropic, not {client!r}"
    )


# Recorded streams --------------------------------------------------------------------


class RecordedStream(Generic[T]):
    """The raw events of a streamed call, in the order the server sent them.

    It iterates once, like the SDK's ``Stream``, and is a context manager; the HTTP
    response is already closed (or, in replay, never existed). :attr:`events` holds
    them all.
    """

    def __init__(self, events: Iterable[T]) -> None:
        self.events: tuple[T, ...] = tuple(events)
        self._iterator = iter(self.events)

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

    def __init__(self, events: Iterable[T]) -> None:
        self.events: tuple[T, ...] = tuple(events)
        self._iterator = iter(self.events)

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


class _RawEvents:
    """What the SDK's ``MessageStream`` reads in place of its HTTP stream: the recorded
    events, and the response they came in (a bodiless stand-in in replay)."""

    def __init__(self, events: Sequence[RawMessageStreamEvent], response: httpx2.Response) -> None:
        self._events = events
        self.response = response

    def __iter__(self) -> Iterator[RawMessageStreamEvent]:
        return iter(self._events)

    def close(self) -> None:
        """Nothing to release: the events were read to their end when recorded."""


class _AsyncRawEvents:
    """The async twin of :class:`_RawEvents`, for ``AsyncMessageStream``."""

    def __init__(self, events: Sequence[RawMessageStreamEvent], response: httpx2.Response) -> None:
        self._events = events
        self.response = response

    async def __aiter__(self) -> AsyncIterator[RawMessageStreamEvent]:
        for event in self._events:
            yield event

    async def close(self) -> None:
        """Nothing to release: the events were read to their end when recorded."""


class RecordedMessageStreamManager:
    """What ``messages.stream(...)`` gives back: entering it makes the call (read to its
    end) and gives the SDK's ``MessageStream`` over the recorded events."""

    def __init__(self, opened: Callable[[], MessageStream[None]]) -> None:
        self._opened = opened
        self._stream: MessageStream[None] | None = None

    def __enter__(self) -> MessageStream[None]:
        self._stream = self._opened()
        return self._stream

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stream is not None:
            self._stream.close()


class AsyncRecordedMessageStreamManager:
    """The async twin of :class:`RecordedMessageStreamManager`, for ``async with``."""

    def __init__(self, opened: Callable[[], Awaitable[AsyncMessageStream[None]]]) -> None:
        self._opened = opened
        self._stream: AsyncMessageStream[None] | None = None

    async def __aenter__(self) -> AsyncMessageStream[None]:
        self._stream = await self._opened()
        return self._stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stream is not None:
            await self._stream.close()


# What is recorded -------------------------------------------------------------------


def _prepared(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments to send, and the request JSON to record.

    Iterators among the arguments (the SDK takes any iterable of messages, blocks and
    tools) are read into lists once, so that what is recorded is what is sent.
    """
    if "output_format" in kwargs:
        raise TypeError(
            "capture_anthropic does not record output_format (the helper turns a type into "
            "a JSON schema): pass the schema as output_config={'format': {...}} instead"
        )
    sent = {name: _materialised(value) for name, value in kwargs.items()}
    request = {
        name: _json_value(value)
        for name, value in sent.items()
        if name not in _NOT_BODY and not _omitted(value)
    }
    extra = sent.get("extra_body")
    if isinstance(extra, Mapping):  # the SDK sends these in the body, over the arguments
        request.update({name: _json_value(value) for name, value in extra.items()})
    return sent, request


def _omitted(value: Any) -> bool:
    return isinstance(value, anthropic.NotGiven | anthropic.Omit)


def _materialised(value: Any) -> Any:
    if isinstance(value, str | bytes | pydantic.BaseModel):
        return value
    if isinstance(value, Mapping):
        return {key: _materialised(item) for key, item in value.items()}
    if isinstance(value, Sequence):
        return [_materialised(item) for item in value]
    return [_materialised(item) for item in value] if isinstance(value, Iterable) else value


def _json_value(value: Any) -> Any:
    """``value`` as JSON; what is not JSON is left for the recorder to reject."""
    if isinstance(value, pydantic.BaseModel):
        # The SDK sends models this way; so the recorded request is the body it sent.
        exclude = getattr(value, "__api_exclude__", None)
        return value.model_dump(mode="json", exclude_unset=True, by_alias=True, exclude=exclude)
    if isinstance(value, Mapping):
        return {key: _json_value(item) for key, item in value.items() if not _omitted(item)}
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, date):
        return value.isoformat()
    return value


def _model(request: Mapping[str, Any]) -> str | None:
    model = request.get("model")
    return model if isinstance(model, str) else None


def _mark(exc: anthropic.APIError) -> None:
    """Make the recorded form of ``exc`` carry what replay needs to rebuild it."""
    status = exc.status_code if isinstance(exc, anthropic.APIStatusError) else None
    details = {
        "message": exc.message,
        "status_code": status,
        "body": exc.body,
        "response_text": _response_text(exc),
    }
    try:
        message = canonical_text(details, path="anthropic.error")
    except NotSerialisable:
        return  # recorded by its type and message alone, and replayed as RecordedError
    # error_info() records this attribute instead of str(exc); see outbox._boundaries.
    exc.recorded_error = {"type": type(exc).__qualname__, "message": message}  # type: ignore[attr-defined]


def _response_text(exc: anthropic.APIError) -> str | None:
    if not isinstance(exc, anthropic.APIStatusError):
        return None
    try:
        return exc.response.text
    except httpx2.ResponseNotRead:  # an error event in the middle of a stream
        return None


# What replay hands back -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    """One call's answer as the agent gets it: the message, or the stream's events."""

    message: Message | None
    events: tuple[RawMessageStreamEvent, ...]
    response: httpx2.Response


def _replayed(
    client: anthropic.Anthropic | anthropic.AsyncAnthropic,
    response: Mapping[str, Any],
    *,
    streamed: bool,
) -> _Answer:
    """The SDK objects of a recorded response, built as the SDK builds them."""
    strict = bool(getattr(client, "_strict_response_validation", False))
    stand_in = httpx2.Response(200, request=httpx2.Request("POST", client.base_url.join(_PATH)))
    if streamed:
        events = tuple(_built(RawMessageStreamEvent, e, strict=strict) for e in response["stream"])
        return _Answer(None, events, stand_in)
    return _Answer(_built(Message, response, strict=strict), (), stand_in)


def _built(type_: Any, data: Any, *, strict: bool) -> Any:
    # The SDK builds its objects without validation unless the client asked for strict
    # validation; replay does the same, so an object is equal to the one record mode
    # handed back also where the server's JSON does not match the SDK's types.
    return (
        validate_type(type_=type_, value=data)
        if strict
        else construct_type(type_=type_, value=data)
    )


def _rebuilt_error(
    recorded: RecordedError, client: anthropic.Anthropic | anthropic.AsyncAnthropic
) -> Exception | None:
    """The ``anthropic`` exception a recorded error stands for, or None for any other."""
    details = _details(recorded.message)
    if details is None:
        return None
    request = httpx2.Request("POST", client.base_url.join(_PATH))
    message, body = str(details.get("message")), details.get("body")
    status, text = details.get("status_code"), details.get("response_text")
    cls = _STATUS_ERRORS.get(recorded.type_name)
    rebuilt: Exception
    if cls is not None and isinstance(status, int):
        content = text.encode() if isinstance(text, str) else b""
        headers = {"content-type": "application/json"}
        response = httpx2.Response(status, content=content, headers=headers, request=request)
        rebuilt = cls(message, response=response, body=body)
    elif recorded.type_name == "APITimeoutError":
        rebuilt = anthropic.APITimeoutError(request=request)
    elif recorded.type_name == "APIConnectionError":
        rebuilt = anthropic.APIConnectionError(message=message, request=request)
    elif recorded.type_name == "APIError":
        rebuilt = anthropic.APIError(message, request, body=body)
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


def _message_stream(answer: _Answer) -> MessageStream[None]:
    raw = _RawEvents(answer.events, answer.response)
    return MessageStream(cast(Any, raw), output_format=anthropic.NOT_GIVEN)


def _async_message_stream(answer: _Answer) -> AsyncMessageStream[None]:
    raw = _AsyncRawEvents(answer.events, answer.response)
    return AsyncMessageStream(cast(Any, raw), output_format=anthropic.NOT_GIVEN)


# Sync ---------------------------------------------------------------------------------


class _Messages:
    """``messages`` of a sync client, through the run's boundary."""

    def __init__(self, client: anthropic.Anthropic, run: AgentRun) -> None:
        self._client = client
        self._run = run
        # The raw-response variant, so the body is recorded exactly as the server sent it.
        self._raw_create: Callable[..., Any] = client.messages.with_raw_response.create

    @overload
    def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> RecordedStream[RawMessageStreamEvent]: ...

    @overload
    def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> Message: ...

    def create(self, **kwargs: Any) -> Message | RecordedStream[RawMessageStreamEvent]:
        """``client.messages.create`` with the same arguments, recorded."""
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))
        answer = self._call(sent, request, streamed=streamed)
        if streamed:
            return RecordedStream(answer.events)
        assert answer.message is not None
        return answer.message

    def stream(self, **kwargs: Any) -> RecordedMessageStreamManager:
        """``client.messages.stream`` with the same arguments: the call is made, and
        recorded, when the returned manager is entered."""
        sent, request = _prepared({**kwargs, "stream": True})
        return RecordedMessageStreamManager(
            lambda: _message_stream(self._call(sent, request, streamed=True))
        )

    def _call(
        self, sent: Mapping[str, Any], request: Mapping[str, Any], *, streamed: bool
    ) -> _Answer:
        originals: list[_Answer] = []

        def send(_: Mapping[str, Any]) -> Mapping[str, Any]:
            try:
                raw = self._raw_create(**sent)
                if streamed:
                    with raw.parse() as stream:
                        events = tuple(stream)
                    originals.append(_Answer(None, events, raw.http_response))
                    return {"stream": [event.to_dict(mode="json") for event in events]}
                originals.append(_Answer(raw.parse(), (), raw.http_response))
                body: Mapping[str, Any] = raw.http_response.json()
                return body
            except anthropic.APIError as exc:
                _mark(exc)
                raise

        try:
            response = self._run.llm(send, request, provider=PROVIDER, model=_model(request))
        except RecordedError as exc:
            rebuilt = _rebuilt_error(exc, self._client)
            if rebuilt is None:
                raise
            raise rebuilt from exc
        return originals[0] if originals else _replayed(self._client, response, streamed=streamed)


class CapturedAnthropic:
    """A sync Anthropic client whose Messages API calls cross the run's ``llm.call``
    boundary.

    Only ``messages.create`` and ``messages.stream`` are offered: any other endpoint
    would reach outside the run unrecorded, so it is not reachable from here.
    """

    def __init__(self, client: anthropic.Anthropic, run: AgentRun) -> None:
        self.client = client
        """The wrapped SDK client."""
        self.run = run
        self.messages = _Messages(client, run)

    def with_options(self, **options: Any) -> CapturedAnthropic:
        """``client.with_options(...)``, captured on the same run."""
        return CapturedAnthropic(self.client.with_options(**options), self.run)


# Async --------------------------------------------------------------------------------


class _AsyncMessages:
    """``messages`` of an async client, through the run's boundary."""

    def __init__(self, client: anthropic.AsyncAnthropic, run: AsyncAgentRun) -> None:
        self._client = client
        self._run = run
        # The raw-response variant, so the body is recorded exactly as the server sent it.
        self._raw_create: Callable[..., Awaitable[Any]] = client.messages.with_raw_response.create

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> AsyncRecordedStream[RawMessageStreamEvent]: ...

    @overload
    async def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> Message: ...

    async def create(self, **kwargs: Any) -> Message | AsyncRecordedStream[RawMessageStreamEvent]:
        """``await client.messages.create`` with the same arguments, recorded."""
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))
        answer = await self._call(sent, request, streamed=streamed)
        if streamed:
            return AsyncRecordedStream(answer.events)
        assert answer.message is not None
        return answer.message

    def stream(self, **kwargs: Any) -> AsyncRecordedMessageStreamManager:
        """``client.messages.stream`` with the same arguments, for ``async with``: the
        call is made, and recorded, when the returned manager is entered."""
        sent, request = _prepared({**kwargs, "stream": True})

        async def opened() -> AsyncMessageStream[None]:
            return _async_message_stream(await self._call(sent, request, streamed=True))

        return AsyncRecordedMessageStreamManager(opened)

    async def _call(
        self, sent: Mapping[str, Any], request: Mapping[str, Any], *, streamed: bool
    ) -> _Answer:
        originals: list[_Answer] = []

        async def send(_: Mapping[str, Any]) -> Mapping[str, Any]:
            try:
                raw = await self._raw_create(**sent)
                if streamed:
                    async with await raw.parse() as stream:
                        events = tuple([event async for event in stream])
                    originals.append(_Answer(None, events, raw.http_response))
                    return {"stream": [event.to_dict(mode="json") for event in events]}
                originals.append(_Answer(await raw.parse(), (), raw.http_response))
                body: Mapping[str, Any] = raw.http_response.json()
                return body
            except anthropic.APIError as exc:
                _mark(exc)
                raise

        try:
            answered = self._run.llm(send, request, provider=PROVIDER, model=_model(request))
            # A replay run answers at once; a recording run is awaited.
            response = await answered if inspect.isawaitable(answered) else answered
        except RecordedError as exc:
            rebuilt = _rebuilt_error(exc, self._client)
            if rebuilt is None:
                raise
            raise rebuilt from exc
        return originals[0] if originals else _replayed(self._client, response, streamed=streamed)


class CapturedAsyncAnthropic:
    """The async twin of :class:`CapturedAnthropic`, for ``anthropic.AsyncAnthropic``."""

    def __init__(self, client: anthropic.AsyncAnthropic, run: AsyncAgentRun) -> None:
        self.client = client
        """The wrapped SDK client."""
        self.run = run
        self.messages = _AsyncMessages(client, run)

    def with_options(self, **options: Any) -> CapturedAsyncAnthropic:
        """``client.with_options(...)``, captured on the same run."""
        return CapturedAsyncAnthropic(self.client.with_options(**options), self.run)
