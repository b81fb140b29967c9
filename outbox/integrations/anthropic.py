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
from functools import partial
from typing import Any, Literal, TypeVar, cast, overload

import anthropic
import httpx2
import pydantic
from anthropic._models import construct_type, validate_type  # how the SDK builds its objects
from anthropic.lib.streaming import AsyncMessageStream, MessageStream
from anthropic.types import Message, RawMessageStreamEvent

from agent_blackbox.outbox._protocol import AgentRun
from agent_blackbox.outbox.integrations import _capture
from agent_blackbox.outbox.integrations._capture import AsyncAgentRun

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

# The SDK's markers of an argument not given; it leaves them out of the body.
_OMITTED = (anthropic.NotGiven, anthropic.Omit)

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


_SDK = _capture.SDK(
    provider=PROVIDER,
    api_error=anthropic.APIError,
    status_error=anthropic.APIStatusError,
    timeout_error=anthropic.APITimeoutError,
    connection_error=anthropic.APIConnectionError,
    status_errors=_status_errors(),
    # An error event in the middle of a stream is a status error with no body read.
    rebuilds_without_text=True,
    construct=construct_type,
    validate=validate_type,
)


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


class RecordedStream(_capture.RecordedStream[T]):
    """The raw events of a streamed call, in the order the server sent them.

    It iterates once, like the SDK's ``Stream``, and is a context manager; the HTTP
    response is already closed (or, in replay, never existed). :attr:`events` holds
    them all.
    """

    def __init__(self, events: Iterable[T]) -> None:
        self.events: tuple[T, ...] = tuple(events)
        super().__init__(self.events)


class AsyncRecordedStream(_capture.AsyncRecordedStream[T]):
    """The async twin of :class:`RecordedStream`, iterated with ``async for``."""

    def __init__(self, events: Iterable[T]) -> None:
        self.events: tuple[T, ...] = tuple(events)
        super().__init__(self.events)


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

    def __exit__(self, *exc_info: object) -> None:
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

    async def __aexit__(self, *exc_info: object) -> None:
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
        if name not in _NOT_BODY and not isinstance(value, _OMITTED)
    }
    extra = sent.get("extra_body")
    if isinstance(extra, Mapping):  # the SDK sends these in the body, over the arguments
        request.update({name: _json_value(value) for name, value in extra.items()})
    return sent, request


def _materialised(value: Any) -> Any:
    if isinstance(value, str | bytes | pydantic.BaseModel):
        return value
    if isinstance(value, Mapping):
        return {key: _materialised(item) for key, item in value.items()}
    if isinstance(value, Sequence):
        return [_materialised(item) for item in value]
    return [_materialised(item) for item in value] if isinstance(value, Iterable) else value


def _json_value(value: Any) -> Any:
    # As the SDK sends it: models by alias, dates as text, NotGiven and Omit left out.
    return _capture.json_value(value, omitted=_OMITTED, by_alias=True, dates=True)


# What the agent is handed -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    """One call's answer as the agent gets it: the message, or the stream's events."""

    message: Message | None
    events: tuple[RawMessageStreamEvent, ...]
    response: httpx2.Response


def _whole(message: Message, raw: Any) -> _capture.Sent[_Answer]:
    """A plain call's answer: the message, and the body exactly as the server sent it."""
    return _Answer(message, (), raw.http_response), raw.http_response.json()


def _streamed(events: tuple[RawMessageStreamEvent, ...], raw: Any) -> _capture.Sent[_Answer]:
    return _Answer(None, events, raw.http_response), _capture.stream_json(events)


def _replayed(
    client: anthropic.Anthropic | anthropic.AsyncAnthropic,
    response: Mapping[str, Any],
    *,
    streamed: bool,
) -> _Answer:
    """The SDK objects of a recorded response, built as the SDK builds them."""
    strict = _capture.strict_validation(client)
    stand_in = httpx2.Response(200, request=httpx2.Request("POST", client.base_url.join(_PATH)))
    if streamed:
        events = tuple(
            _SDK.built(RawMessageStreamEvent, e, strict=strict) for e in response["stream"]
        )
        return _Answer(None, events, stand_in)
    return _Answer(_SDK.built(Message, response, strict=strict), (), stand_in)


def _message_stream(answer: _Answer) -> MessageStream[None]:
    raw = _RawEvents(answer.events, answer.response)
    return MessageStream(cast(Any, raw), output_format=anthropic.NOT_GIVEN)


def _async_message_stream(answer: _Answer) -> AsyncMessageStream[None]:
    raw = _AsyncRawEvents(answer.events, answer.response)
    return AsyncMessageStream(cast(Any, raw), output_format=anthropic.NOT_GIVEN)


class _Calls:
    """What the sync and the async ``messages`` share: the client, the run and where
    the Messages API posts."""

    def __init__(self, client: anthropic.Anthropic | anthropic.AsyncAnthropic, run: Any) -> None:
        self._client = client
        self._run = run

    def _replayed(self, streamed: bool) -> Callable[[Mapping[str, Any]], _Answer]:
        return partial(_replayed, self._client, streamed=streamed)

    def _url(self) -> httpx2.URL:
        return self._client.base_url.join(_PATH)


# Sync ---------------------------------------------------------------------------------


class _Messages(_Calls):
    """``messages`` of a sync client, through the run's boundary."""

    def __init__(self, client: anthropic.Anthropic, run: AgentRun) -> None:
        super().__init__(client, run)
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
        answer = self._call(*_prepared(kwargs))
        return RecordedStream(answer.events) if answer.message is None else answer.message

    def stream(self, **kwargs: Any) -> RecordedMessageStreamManager:
        """``client.messages.stream`` with the same arguments: the call is made, and
        recorded, when the returned manager is entered."""
        sent, request = _prepared({**kwargs, "stream": True})
        return RecordedMessageStreamManager(lambda: _message_stream(self._call(sent, request)))

    def _call(self, sent: Mapping[str, Any], request: Mapping[str, Any]) -> _Answer:
        streamed = bool(sent.get("stream"))

        def send() -> _capture.Sent[_Answer]:
            raw = self._raw_create(**sent)
            if not streamed:
                return _whole(raw.parse(), raw)
            with raw.parse() as stream:
                events = tuple(stream)
            return _streamed(events, raw)

        return _capture.recorded_call(
            _SDK, self._run, request, send=send, replayed=self._replayed(streamed), url=self._url
        )


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


class _AsyncMessages(_Calls):
    """``messages`` of an async client, through the run's boundary."""

    def __init__(self, client: anthropic.AsyncAnthropic, run: AsyncAgentRun) -> None:
        super().__init__(client, run)
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
        answer = await self._call(*_prepared(kwargs))
        return AsyncRecordedStream(answer.events) if answer.message is None else answer.message

    def stream(self, **kwargs: Any) -> AsyncRecordedMessageStreamManager:
        """``client.messages.stream`` with the same arguments, for ``async with``: the
        call is made, and recorded, when the returned manager is entered."""
        sent, request = _prepared({**kwargs, "stream": True})

        async def opened() -> AsyncMessageStream[None]:
            return _async_message_stream(await self._call(sent, request))

        return AsyncRecordedMessageStreamManager(opened)

    async def _call(self, sent: Mapping[str, Any], request: Mapping[str, Any]) -> _Answer:
        streamed = bool(sent.get("stream"))

        async def send() -> _capture.Sent[_Answer]:
            raw = await self._raw_create(**sent)
            if not streamed:
                return _whole(await raw.parse(), raw)
            async with await raw.parse() as stream:
                events = tuple([event async for event in stream])
            return _streamed(events, raw)

        return await _capture.recorded_call_async(
            _SDK, self._run, request, send=send, replayed=self._replayed(streamed), url=self._url
        )


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
