"""What the LLM SDK captures share, whatever the SDK.

Each integration module (:mod:`.openai`, :mod:`.anthropic`) imports its own SDK and
describes it here with an :class:`SDK`: its provider name, its API error classes and how
it builds its response objects. This module imports no SDK, so an agent loads only the
one it uses.

The shared parts are the recorded streams (read to their end before the agent sees
them), the JSON of the request the SDK sends, the recorded form of an API error and its
rebuilding in replay, and one call through the run's ``llm.call`` boundary, written once
and driven by a thin sync and a thin async shell (:func:`recorded_call`,
:func:`recorded_call_async`). What a call sends and how it reads the answer stays with
the SDK's module.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from typing import Any, Generic, Protocol, Self, TypeVar

import httpx2
import pydantic

from agent_blackbox.outbox._errors import RecordedError
from agent_blackbox.outbox._protocol import AgentRun
from agent_blackbox.schemas import NotSerialisable, canonical_text

T = TypeVar("T")

Sent = tuple[T, Mapping[str, Any]]
"""What a send gives back: the SDK's own object for the agent, and the JSON to record."""


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


# Recorded streams --------------------------------------------------------------------


class RecordedStream(Generic[T]):
    """Iterates once over the items of a stream that was read to its end when the call
    was made, like the SDK's ``Stream``; a context manager. Closing only stops the
    iteration: the HTTP response is already closed (or, in replay, never existed).

    Each SDK's module subclasses it to name the items as that SDK does.
    """

    def __init__(self, items: Iterable[T]) -> None:
        self._iterator: Iterator[T] = iter(items)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        return next(self._iterator)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the iteration; nothing is left open."""
        self._iterator = iter(())


class AsyncRecordedStream(Generic[T]):
    """The async twin of :class:`RecordedStream`, iterated with ``async for``."""

    def __init__(self, items: Iterable[T]) -> None:
        self._iterator: Iterator[T] = iter(items)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        try:
            return next(self._iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the iteration; nothing is left open."""
        self._iterator = iter(())


# What is recorded -------------------------------------------------------------------


def json_value(
    value: Any,
    *,
    omitted: tuple[type[Any], ...] = (),
    by_alias: bool = False,
    dates: bool = False,
) -> Any:
    """``value`` as the JSON the SDK sends for it; what is not JSON is left for the
    recorder to reject (:class:`~agent_blackbox.schemas.NotSerialisable`).

    Args:
        value: a keyword argument of an SDK call, or a part of one.
        omitted: the SDK's markers of an argument not given (``NotGiven``, ``Omit``);
            a mapping's items holding one are left out, as the SDK leaves them out.
        by_alias: dump models under their fields' aliases (as the ``anthropic`` SDK
            sends them).
        dates: write dates and datetimes as ISO 8601 text (as the ``anthropic`` SDK
            sends them).
    """
    if isinstance(value, pydantic.BaseModel):
        # The SDK sends models this way; so the recorded request is the body it sent.
        exclude = getattr(value, "__api_exclude__", None)
        return value.model_dump(mode="json", exclude_unset=True, by_alias=by_alias, exclude=exclude)
    if isinstance(value, Mapping):
        return {
            key: json_value(item, omitted=omitted, by_alias=by_alias, dates=dates)
            for key, item in value.items()
            if not isinstance(item, omitted)
        }
    if isinstance(value, list | tuple):
        return [json_value(item, omitted=omitted, by_alias=by_alias, dates=dates) for item in value]
    if dates and isinstance(value, date):
        return value.isoformat()
    return value


def stream_json(events: Iterable[Any]) -> dict[str, Any]:
    """The recorded response of a streamed call: each event's JSON as the SDK parsed it
    (``to_dict()``: the keys the server sent, under the names it sent them)."""
    return {"stream": [event.to_dict(mode="json") for event in events]}


def model_of(request: Mapping[str, Any]) -> str | None:
    """The model a request names, recorded beside it; None where it names none."""
    model = request.get("model")
    return model if isinstance(model, str) else None


def strict_validation(client: object) -> bool:
    """Whether ``client`` was created with strict response validation."""
    return bool(getattr(client, "_strict_response_validation", False))


# The SDK ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SDK:
    """What the shared capture code needs of one LLM SDK; its module makes one.

    The error classes are held as values (the SDKs name theirs alike: ``APIError``,
    ``APIStatusError``, ``APITimeoutError``, ``APIConnectionError``), so that replay
    raises a recorded error again as the SDK's own class, chosen by the recorded class
    name among these only: nothing from a payload is imported or executed.
    """

    provider: str
    """The provider name every captured call is recorded under."""
    api_error: type[Any]
    """The root of the SDK's API errors; one raised by a send is marked for replay."""
    status_error: type[Any]
    """The API error with an HTTP status and a response."""
    timeout_error: type[Any]
    connection_error: type[Any]
    status_errors: Mapping[str, type[Any]]
    """The status error classes replay raises again, by class name."""
    rebuilds_without_text: bool
    """Whether a status error recorded without its response text is rebuilt (with an
    empty body): an error event in the middle of an ``anthropic`` stream has none read."""
    construct: Callable[..., Any]
    """The SDK's own builder of a response object without validation."""
    validate: Callable[..., Any]
    """The SDK's own builder of a response object with validation."""

    def built(self, type_: Any, data: Any, *, strict: bool) -> Any:
        """The SDK object of ``type_`` made from recorded JSON, as the SDK makes it."""
        # The SDK builds its objects without validation unless the client asked for strict
        # validation; replay does the same, so an object is equal to the one record mode
        # handed back also where the server's JSON does not match the SDK's types.
        build = self.validate if strict else self.construct
        return build(type_=type_, value=data)

    def mark(self, exc: Any) -> None:
        """Make the recorded form of the API error ``exc`` carry what replay needs to
        rebuild it: canonical JSON of its message, status, body and response text."""
        status = exc.status_code if isinstance(exc, self.status_error) else None
        details = {
            "message": exc.message,
            "status_code": status,
            "body": exc.body,
            "response_text": self._response_text(exc),
        }
        try:
            message = canonical_text(details, path=f"{self.provider}.error")
        except NotSerialisable:
            return  # recorded by its type and message alone, and replayed as RecordedError
        # error_info() records this attribute instead of str(exc); see outbox._boundaries.
        exc.recorded_error = {"type": type(exc).__qualname__, "message": message}

    def _response_text(self, exc: Any) -> str | None:
        if not isinstance(exc, self.status_error):
            return None
        try:
            text: str = exc.response.text
        except httpx2.ResponseNotRead:  # an error event in the middle of a stream
            return None
        return text

    def rebuilt_error(self, recorded: RecordedError, url: httpx2.URL) -> Exception | None:
        """The SDK exception a recorded error stands for, or None for any other.

        Args:
            recorded: what replay raised for the recorded error.
            url: where the call posts, for the rebuilt error's request.
        """
        details = _details(recorded.message)
        if details is None:
            return None
        request = httpx2.Request("POST", url)
        message, body = str(details.get("message")), details.get("body")
        status, text = details.get("status_code"), details.get("response_text")
        cls = self.status_errors.get(recorded.type_name)
        with_text = isinstance(text, str) or self.rebuilds_without_text
        rebuilt: Exception
        if cls is not None and isinstance(status, int) and with_text:
            content = text.encode() if isinstance(text, str) else b""
            headers = {"content-type": "application/json"}
            response = httpx2.Response(status, content=content, headers=headers, request=request)
            rebuilt = cls(message, response=response, body=body)
        elif recorded.type_name == "APITimeoutError":
            rebuilt = self.timeout_error(request=request)
        elif recorded.type_name == "APIConnectionError":
            rebuilt = self.connection_error(message=message, request=request)
        elif recorded.type_name == "APIError":
            rebuilt = self.api_error(message, request, body=body)
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


# One call through the boundary ------------------------------------------------------


@contextmanager
def _marking(sdk: SDK) -> Iterator[None]:
    """Mark an API error a send raises, so that its recorded form can be rebuilt."""
    try:
        yield
    except sdk.api_error as exc:
        sdk.mark(exc)
        raise


@contextmanager
def _rebuilding(sdk: SDK, url: Callable[[], httpx2.URL]) -> Iterator[None]:
    """Raise an API error that replay answers with as the SDK's own class again."""
    try:
        yield
    except RecordedError as exc:
        rebuilt = sdk.rebuilt_error(exc, url())
        if rebuilt is None:
            raise
        raise rebuilt from exc


class _Originals(Generic[T]):
    """The SDK's own objects a send made in record mode, handed back to the agent as
    they are (with their request id); in replay there are none, and the recorded
    response is rebuilt instead."""

    def __init__(self) -> None:
        self._kept: list[T] = []

    def keep(self, sent: Sent[T]) -> Mapping[str, Any]:
        original, response = sent
        self._kept.append(original)
        return response

    def handed_back(
        self, response: Mapping[str, Any], replayed: Callable[[Mapping[str, Any]], T]
    ) -> T:
        return self._kept[0] if self._kept else replayed(response)


def recorded_call(
    sdk: SDK,
    run: AgentRun,
    request: Mapping[str, Any],
    *,
    send: Callable[[], Sent[T]],
    replayed: Callable[[Mapping[str, Any]], T],
    url: Callable[[], httpx2.URL],
) -> T:
    """One SDK call through ``run``'s ``llm.call`` boundary.

    Args:
        sdk: the SDK the call is made with.
        run: a record-mode run, which calls ``send``, or a replay run, which answers
            from the log.
        request: the JSON of the request, as recorded.
        send: makes the call; gives the SDK's object and the response JSON to record.
            An API error it raises is marked (:meth:`SDK.mark`) and raised on.
        replayed: the SDK's object rebuilt from a recorded response, in replay.
        url: where the call posts, for an API error rebuilt in replay.

    Returns:
        What ``send`` gave the agent, or in replay its rebuilt twin.

    Raises:
        Exception: a recorded API error, raised again as the SDK's own class where it
            is one of them, else as the run raises it.
    """
    originals = _Originals[T]()

    def sent(_: Mapping[str, Any]) -> Mapping[str, Any]:
        with _marking(sdk):
            return originals.keep(send())

    with _rebuilding(sdk, url):
        response = run.llm(sent, request, provider=sdk.provider, model=model_of(request))
    return originals.handed_back(response, replayed)


async def recorded_call_async(
    sdk: SDK,
    run: AsyncAgentRun,
    request: Mapping[str, Any],
    *,
    send: Callable[[], Awaitable[Sent[T]]],
    replayed: Callable[[Mapping[str, Any]], T],
    url: Callable[[], httpx2.URL],
) -> T:
    """The async twin of :func:`recorded_call`, for an async client and run."""
    originals = _Originals[T]()

    async def sent(_: Mapping[str, Any]) -> Mapping[str, Any]:
        with _marking(sdk):
            return originals.keep(await send())

    with _rebuilding(sdk, url):
        answered = run.llm(sent, request, provider=sdk.provider, model=model_of(request))
        # A replay run answers at once; a recording run is awaited.
        response = await answered if inspect.isawaitable(answered) else answered
    return originals.handed_back(response, replayed)
