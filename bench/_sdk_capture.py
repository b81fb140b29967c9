"""THE PREVIOUS IMPLEMENTATION, kept only so that ``bench.capture`` can compare against it:
the SDK-level capture of the ``openai`` SDK this project shipped until recording moved to
the HTTP transport (``outbox/integrations/openai.py`` and ``_capture.py`` at 9c2b289).
Nothing in the project imports it; do not use it in an agent.

Only its record path for ``chat.completions.create`` is here, sync and async, cut down
to what one call costs: the keyword arguments turned into the recorded request JSON, the
call made through the SDK's raw-response variant inside ``run.llm(send, request,
provider=, model=)`` (a method today's runs still have), the SDK's object handed back
with the body as the server sent it recorded, and a stream read to its end inside
``create()`` before the agent sees its first chunk. Left out, since the bench never
takes those paths: replay (rebuilding objects and errors from the log), marking API
errors for replay, ``responses.create`` and ``with_options``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import openai
import pydantic

PROVIDER = "openai"

# Options of the SDK that shape the HTTP exchange, not the JSON body; never recorded.
_TRANSPORT_OPTIONS = frozenset({"extra_headers", "extra_query", "timeout"})


def _json_value(value: Any) -> Any:
    """``value`` as the JSON the SDK sends for it."""
    if isinstance(value, pydantic.BaseModel):
        exclude = getattr(value, "__api_exclude__", None)
        return value.model_dump(mode="json", exclude_unset=True, exclude=exclude)
    if isinstance(value, Mapping):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    return value


def _materialised(value: Any) -> Any:
    if isinstance(value, str | bytes | Mapping | Sequence | pydantic.BaseModel):
        return value
    return list(value) if isinstance(value, Iterable) else value


def _prepared(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments to send, and the request JSON to record."""
    sent = {name: _materialised(value) for name, value in kwargs.items()}
    request = {
        name: _json_value(value)
        for name, value in sent.items()
        if name not in _TRANSPORT_OPTIONS and not isinstance(value, openai.NotGiven | openai.Omit)
    }
    return sent, request


def _model_of(request: Mapping[str, Any]) -> str | None:
    model = request.get("model")
    return model if isinstance(model, str) else None


def _stream_json(chunks: Iterable[Any]) -> dict[str, Any]:
    return {"stream": [chunk.to_dict(mode="json") for chunk in chunks]}


class RecordedStream:
    """The chunks of a streamed call, read to the end before ``create()`` returned."""

    def __init__(self, chunks: Iterable[Any]) -> None:
        self._iterator: Iterator[Any] = iter(tuple(chunks))

    def __iter__(self) -> Iterator[Any]:
        return self._iterator

    def close(self) -> None:
        """Nothing is open: the response was closed when the stream was read."""


class AsyncRecordedStream:
    """The async twin of :class:`RecordedStream`."""

    def __init__(self, chunks: Iterable[Any]) -> None:
        self._iterator: Iterator[Any] = iter(tuple(chunks))

    def __aiter__(self) -> AsyncRecordedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        """Nothing is open: the response was closed when the stream was read."""


class _Kept:
    """The SDK object a send made, handed back to the agent as it is."""

    def __init__(self) -> None:
        self.original: Any = None

    def keep(self, original: Any, response: Mapping[str, Any]) -> Mapping[str, Any]:
        self.original = original
        return response


class _Completions:
    def __init__(self, client: openai.OpenAI, run: Any) -> None:
        self._raw_create: Callable[..., Any] = client.chat.completions.with_raw_response.create
        self._run = run

    def create(self, **kwargs: Any) -> Any:
        """``client.chat.completions.create``, recorded as the previous capture did."""
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))
        kept = _Kept()

        def send(_: Mapping[str, Any]) -> Mapping[str, Any]:
            raw = self._raw_create(**sent)
            if not streamed:
                return kept.keep(raw.parse(), raw.http_response.json())
            with raw.parse() as stream:
                chunks = list(stream)
            return kept.keep(chunks, _stream_json(chunks))

        self._run.llm(send, request, provider=PROVIDER, model=_model_of(request))
        return RecordedStream(kept.original) if streamed else kept.original


class _AsyncCompletions:
    def __init__(self, client: openai.AsyncOpenAI, run: Any) -> None:
        self._raw_create: Callable[..., Awaitable[Any]] = (
            client.chat.completions.with_raw_response.create
        )
        self._run = run

    async def create(self, **kwargs: Any) -> Any:
        """``await client.chat.completions.create``, recorded as the previous capture did."""
        sent, request = _prepared(kwargs)
        streamed = bool(sent.get("stream"))
        kept = _Kept()

        async def send(_: Mapping[str, Any]) -> Mapping[str, Any]:
            raw = await self._raw_create(**sent)
            if not streamed:
                return kept.keep(raw.parse(), raw.http_response.json())
            async with raw.parse() as stream:
                chunks = [chunk async for chunk in stream]
            return kept.keep(chunks, _stream_json(chunks))

        answered = self._run.llm(send, request, provider=PROVIDER, model=_model_of(request))
        if inspect.isawaitable(answered):
            await answered
        return AsyncRecordedStream(kept.original) if streamed else kept.original


class _Chat:
    def __init__(self, completions: Any) -> None:
        self.completions = completions


class CapturedOpenAI:
    """The previous capture of a sync client for one run: ``chat.completions.create``."""

    def __init__(self, client: openai.OpenAI, run: Any) -> None:
        self.chat = _Chat(_Completions(client, run))


class CapturedAsyncOpenAI:
    """The previous capture of an async client for one run."""

    def __init__(self, client: openai.AsyncOpenAI, run: Any) -> None:
        self.chat = _Chat(_AsyncCompletions(client, run))
