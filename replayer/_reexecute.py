"""Re-execution: re-send each recorded LLM request of a run and compare the answers.

Only the answer's content is compared (text, finish reason, tool calls by name and
parsed arguments, usage); ids, creation times and system fingerprints change on every
call and are left out. Answers of either API (OpenAI-compatible chat completions and
Responses, Anthropic Messages) are compared through the same view, so a call may be
re-sent to the other provider's API: only through a request mapper the user supplies,
which turns the recorded request into one that API takes (there is no faithful
translation to guess: system prompts, tool formats and required fields differ).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent_blackbox.outbox import completion_view
from agent_blackbox.replayer._fork import ForkError
from agent_blackbox.replayer._fork_diff import llm_summary, recorded_response
from agent_blackbox.replayer._registry import UnknownAgent, load_entry
from agent_blackbox.schemas import Envelope, EventType, PayloadPipeline, refusing_plaintext

IGNORED_FIELDS = ("id", "created", "system_fingerprint")
"""What differs between two answers to the same request by design: never compared."""

COMPARED_FIELDS = ("text", "finish_reason", "tool_calls", "usage")

APIS = ("openai", "anthropic")
"""The APIs an :class:`Endpoint` speaks: ``openai`` (OpenAI-compatible chat completions
and Responses) and ``anthropic`` (the Anthropic Messages API)."""

RequestMapper = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""Turns a recorded request into one the endpoint's API takes (for example an OpenAI
chat request into an Anthropic Messages request); it must not change its argument."""

Send = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class ReexecuteSetupError(ForkError):
    """A recorded call cannot be re-sent as asked: the endpoint speaks another API and
    no request mapper was given, the mapper failed, or no endpoint was given for the
    call's API. A setup problem, never reported as a changed answer."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where re-sent requests go: the API it speaks (one of :data:`APIS`) and how to
    send a raw request to it (returning the raw answer, a stream as ``{"stream":
    [...]}``). Calling it sends."""

    api: str
    send: Send

    def __call__(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.send(request)


def api_of(provider: str) -> str:
    """The API a call recorded under ``provider`` was made with: ``anthropic`` for the
    Anthropic capture, ``openai`` (OpenAI-compatible JSON) for every other provider."""
    return "anthropic" if provider == "anthropic" else "openai"


@dataclass(frozen=True, slots=True)
class CallDiff:
    """One re-sent LLM request: what came back then and now, field by field."""

    sequence: int
    model: str
    changed: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    """Field → (recorded, now), for the fields of :data:`COMPARED_FIELDS` that differ."""
    error: str | None = None
    recorded: Mapping[str, Any] = field(default_factory=dict)
    """The recorded answer's comparable content (see ``llm_summary``)."""
    now: Mapping[str, Any] = field(default_factory=dict)
    streamed: bool = False
    uncompared: Mapping[str, str] = field(default_factory=dict)
    """Field → why it was left out of the comparison (usage a stream did not carry)."""

    @property
    def same(self) -> bool:
        return not self.changed and self.error is None

    def to_dict(self) -> dict[str, Any]:
        """The call's structured diff: each compared field recorded and now."""
        fields: dict[str, Any] = {}
        for name in COMPARED_FIELDS:
            before, after = self.recorded.get(name), self.now.get(name)
            entry: dict[str, Any] = {"recorded": before, "now": after}
            if name in self.uncompared:
                entry.update(compared=False, same=None, note=self.uncompared[name])
            else:
                entry.update(compared=True, same=name not in self.changed)
            fields[name] = entry
        return {
            "sequence": self.sequence,
            "model": self.model,
            "streamed": self.streamed,
            "same": self.same,
            "error": self.error,
            "changed": {k: {"recorded": v[0], "now": v[1]} for k, v in self.changed.items()},
            "fields": fields if self.error is None else {},
        }


def reexecute(
    events: Iterable[Envelope],
    send: Send | Endpoint | Mapping[str, Endpoint],
    *,
    pipeline: PayloadPipeline | None = None,
    request_mapper: RequestMapper | None = None,
) -> list[CallDiff]:
    """Re-send every recorded raw LLM request through ``send`` and diff the answers
    (text, finish reason, tool calls by name and parsed arguments, usage), ignoring ids,
    creation times and system fingerprints.

    A streamed call is re-sent streamed, so like is compared with like; a streamed chat
    completion asks for usage in the stream (``stream_options.include_usage``), and
    usage is left out of the comparison when the recording has none. ``send`` returns
    a streamed answer as ``{"stream": [chunk, ...]}``, as the recorder stores one.

    Args:
        events: the run's events in sequence order.
        send: a plain callable (every request is sent to it as recorded), an
            :class:`Endpoint` (a call recorded with the other API goes through
            ``request_mapper``), or endpoints by API (each call goes to the endpoint of
            its own API; see :func:`route`).
        pipeline: opens the bodies.
        request_mapper: turns a request recorded with one API into one for the
            endpoint's other API; used for those calls only.

    Raises:
        ReexecuteSetupError: a call cannot be sent as asked (see :func:`route`); raised
            before that call is sent. Call :func:`check_routes` first to find out before
            any call is.
    """
    opener = pipeline or PayloadPipeline()
    diffs = []
    for envelope in refusing_plaintext(events):
        if envelope.event_type != EventType.LLM_CALL:
            continue
        body = opener.unpack(envelope)
        if body["raw_request_json"] is None or _reduced(body):
            diffs.append(CallDiff(envelope.sequence, body["model"], error=_NOT_KEPT))
            continue
        left_out = _not_compared(json.loads(body["raw_request_json"]), recorded_response(body))
        if left_out is not None:
            notes = dict.fromkeys(COMPARED_FIELDS, left_out)
            diffs.append(CallDiff(envelope.sequence, body["model"], uncompared=notes))
            continue
        target, api, mapper = route(
            envelope.sequence, str(body["provider"]), send, request_mapper=request_mapper
        )
        request = _mapped(envelope.sequence, json.loads(body["raw_request_json"]), mapper)
        streamed = bool(request.get("stream"))
        try:
            fresh = target(_with_stream_usage(request, api) if streamed else request)
        except Exception as exc:  # the endpoint's failure is part of the comparison
            failed = (body.get("error") or {}).get("type")
            if failed in _names(exc):  # it failed the same way when recorded
                note = f"the call failed with {failed} when recorded, and again now"
                same = CallDiff(envelope.sequence, body["model"], streamed=streamed)
                diffs.append(replace(same, uncompared=dict.fromkeys(COMPARED_FIELDS, note)))
                continue
            diffs.append(
                CallDiff(
                    envelope.sequence,
                    body["model"],
                    error=f"{type(exc).__name__}: {exc}",
                    streamed=streamed,
                )
            )
            continue
        before, after = llm_summary(recorded_response(body)), llm_summary(fresh)
        uncompared = _uncompared(before, after)
        changed = {
            k: (before[k], after[k])
            for k in COMPARED_FIELDS
            if k not in uncompared and before[k] != after[k]
        }
        diffs.append(
            CallDiff(
                envelope.sequence, body["model"], changed, None, before, after, streamed, uncompared
            )
        )
    return diffs


_NOT_KEPT = (
    "recorded truncated over the blob ceiling: the whole request or response was not kept, "
    "so the call was not re-sent"
)


def _names(exc: BaseException) -> set[str]:
    """The names a failure may have been recorded under: its class's, and (a transport
    error the SDK wrapped: ``APIConnectionError`` from ``ConnectError``) its cause's,
    since a capture at the HTTP transport records the error the transport raised."""
    names = {type(exc).__name__}
    if exc.__cause__ is not None:
        names.add(type(exc.__cause__).__name__)
    return names


def _reduced(body: Mapping[str, Any]) -> bool:
    return body.get("body_truncated") is not None and body["raw_response_json"] is None


def _not_compared(request: Mapping[str, Any], response: Mapping[str, Any] | None) -> str | None:
    """Why a recorded call is not re-sent, or None. A capture at the HTTP transport
    records every model API an SDK calls; re-execution compares replies (chat
    completions, Responses, Messages), so it leaves out the calls whose answer is none
    (embeddings, token counts, moderations) and the APIs its senders do not speak (the
    legacy completions): sent as if they were, they would reach the wrong API."""
    if response is not None and not completion_view(response).get("choices"):
        return (
            "not re-sent: its answer is not a reply (an embeddings, token count or moderation call)"
        )
    if "messages" not in request and "input" not in request:
        return "not re-sent: re-execution sends chat, Responses and Messages requests only"
    return None


def route(
    sequence: int,
    provider: str,
    send: Send | Endpoint | Mapping[str, Endpoint],
    *,
    request_mapper: RequestMapper | None = None,
) -> tuple[Send, str, RequestMapper | None]:
    """Where the call ``sequence``, recorded under ``provider``, is sent: the sender, the
    API it speaks, and the mapper its request goes through (None: sent as recorded).

    A plain callable takes every call as recorded. An :class:`Endpoint` takes the calls
    of its own API as recorded and the others through ``request_mapper``. Endpoints by
    API send each call to the one of its own API; when there is none for it, a single
    endpoint takes it as an :class:`Endpoint` would.

    Raises:
        ReexecuteSetupError: the call's API is not the endpoint's and no mapper was
            given, or several endpoints were given and none speaks the call's API.
    """
    api = api_of(provider)
    if isinstance(send, Mapping):
        if api in send:
            return route(sequence, provider, send[api])
        if len(send) != 1:
            raise ReexecuteSetupError(
                f"call {sequence} was recorded from provider {provider!r} ({api} API) and no "
                f"endpoint speaks that API (endpoints for: {', '.join(sorted(send))})"
            )
        (send,) = send.values()
    if not isinstance(send, Endpoint):
        return send, api, None
    if send.api == api:
        return send, api, None
    if request_mapper is None:
        raise ReexecuteSetupError(
            f"call {sequence} was recorded from provider {provider!r} ({api} API) but the "
            f"endpoint speaks the {send.api} API: pass a request mapper that turns {api} "
            f"requests into {send.api} ones (on the command line --request-mapper "
            f"module:function), or an endpoint of the {api} API"
        )
    return send, send.api, request_mapper


def check_routes(
    events: Iterable[Envelope],
    send: Send | Endpoint | Mapping[str, Endpoint],
    *,
    request_mapper: RequestMapper | None = None,
) -> None:
    """Check that every LLM call of ``events`` can be routed (:func:`route`), by the
    provider its event's attributes name, before any request is sent.

    Raises:
        ReexecuteSetupError: the first call that cannot be.
    """
    for envelope in events:
        provider = envelope.attributes.get("provider")
        if envelope.event_type == EventType.LLM_CALL and provider is not None:
            route(envelope.sequence, provider, send, request_mapper=request_mapper)


def load_request_mapper(path: str) -> RequestMapper:
    """Import a request mapper given as ``module:function``.

    Raises:
        ReexecuteSetupError: the path is malformed, or the module or function cannot be
            loaded (the message says which, and why).
    """
    try:
        return load_entry(path)  # type: ignore[return-value]  # a callable; checked on use
    except UnknownAgent as exc:
        raise ReexecuteSetupError(f"request mapper: {exc}") from exc


def _mapped(
    sequence: int, request: Mapping[str, Any], mapper: RequestMapper | None
) -> Mapping[str, Any]:
    """``request`` through ``mapper`` (when there is one), checked to be a JSON object."""
    if mapper is None:
        return request
    try:
        mapped = mapper(request)
    except Exception as exc:  # the user's own code: anything can fail
        raise ReexecuteSetupError(
            f"the request mapper failed on call {sequence}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(mapped, Mapping):
        raise ReexecuteSetupError(
            f"the request mapper returned a {type(mapped).__name__} for call {sequence}; "
            "it must return the request to send, a mapping"
        )
    return mapped


def _with_stream_usage(request: Mapping[str, Any], api: str) -> dict[str, Any]:
    """A streamed chat completion that also asks for its usage (the last chunk); other
    requests as they were (a Responses API or Anthropic stream carries usage in its
    events)."""
    if api != "openai" or "messages" not in request:
        return dict(request)
    options = {**(request.get("stream_options") or {}), "include_usage": True}
    return {**request, "stream_options": options}


def _uncompared(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, str]:
    if before["usage"] is None:
        return {"usage": "the recording has no usage (a stream that did not ask for it)"}
    if after["usage"] is None:
        return {"usage": "the endpoint sent no usage this time"}
    return {}


def openai_sender(base_url: str, api_key: str) -> Endpoint:
    """Sends a raw chat-completion or Responses API request with the official SDK
    (``openai`` extra); a streamed request is read to its end and returned as
    ``{"stream": [chunk, ...]}``.

    Raises:
        ForkError: the ``openai`` SDK is not installed.
    """
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise ForkError(
            "re-execution needs the openai SDK: pip install 'agent-blackbox[openai]'"
        ) from exc
    # Each request is sent once: a retried answer is not the one to compare.
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        arguments = dict(request)
        endpoint: Any = client.chat.completions if "messages" in arguments else client.responses
        if arguments.get("stream"):
            with endpoint.create(**arguments) as stream:
                return {"stream": [chunk.to_dict(mode="json") for chunk in stream]}
        body: dict[str, Any] = endpoint.create(**arguments).to_dict(mode="json")
        return body

    return Endpoint("openai", send)


def anthropic_sender(base_url: str, api_key: str) -> Endpoint:
    """Sends a raw Messages API request with the official SDK (``anthropic`` extra); a
    streamed request is read to its end and returned as ``{"stream": [event, ...]}``, as
    the capture records one.

    The request's fields the SDK's ``messages.create`` does not name go in the body as
    they are (``extra_body``), so a request recorded with a field newer than the SDK is
    re-sent whole.

    Raises:
        ForkError: the ``anthropic`` SDK is not installed.
    """
    try:
        import anthropic
    except ImportError as exc:
        raise ForkError(
            "re-execution of Anthropic calls needs the anthropic SDK: "
            "pip install 'agent-blackbox[anthropic]'"
        ) from exc
    # Each request is sent once: a retried answer is not the one to compare.
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
    named = set(inspect.signature(client.messages.create).parameters) - _SDK_OPTIONS

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        arguments = {k: v for k, v in request.items() if k in named}
        extra = {k: v for k, v in request.items() if k not in named}
        raw = client.messages.with_raw_response.create(**arguments, extra_body=extra or None)
        if arguments.get("stream"):
            with raw.parse() as stream:
                return {"stream": [event.to_dict(mode="json") for event in stream]}
        body: dict[str, Any] = raw.http_response.json()
        return body

    return Endpoint("anthropic", send)


# Arguments of the SDK's methods that are not body fields.
_SDK_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


_SENDERS = {"openai": openai_sender, "anthropic": anthropic_sender}


def recorded_apis(events: Iterable[Envelope]) -> list[str]:
    """The APIs the LLM calls of ``events`` were made with (see :func:`api_of`), sorted."""
    return sorted(
        {
            api_of(envelope.attributes.get("provider", "openai"))
            for envelope in events
            if envelope.event_type == EventType.LLM_CALL
        }
    )


def endpoints_for(
    events: Iterable[Envelope],
    base_url: str | Mapping[str, str],
    *,
    api_key: str | Mapping[str, str],
    api: str | None = None,
) -> dict[str, Endpoint]:
    """The endpoints a run's LLM calls are re-sent to, by API, for :func:`reexecute`:
    one for each API the run's calls were made with (Anthropic calls through the
    anthropic SDK, every other provider's through the OpenAI-compatible one), or, with
    ``api``, one endpoint of that API only (a call of the other then needs a request
    mapper).

    Args:
        events: the run's events.
        base_url: the endpoint's URL, or one per API (``{"openai": url, "anthropic":
            url}``; an API the run did not call may be left out). One URL serves a run
            of one API; a run that called both needs one per API.
        api_key: the key of every endpoint, or one per API.
        api: the one API the endpoint speaks, if it speaks one only.

    Raises:
        ReexecuteSetupError: one URL for a run that called both APIs, no URL or key for
            an API the run called, or an API that is not one of :data:`APIS`.
    """
    wanted = [api] if api is not None else (recorded_apis(events) or ["openai"])
    urls = _per_api(base_url, wanted, what="base URL", option="--base-url", shared=False)
    keys = _per_api(api_key, wanted, what="key", option="--api-key-env", shared=True)
    return {name: _SENDERS[name](urls[name], keys[name]) for name in wanted}


def _per_api(
    given: str | Mapping[str, str], wanted: list[str], *, what: str, option: str, shared: bool
) -> dict[str, str]:
    """``given`` for each API of ``wanted``: one value for all (when it may be
    ``shared``, or serves one API), or the value named for each."""
    if isinstance(given, str):
        if len(wanted) > 1 and not shared:
            raise ReexecuteSetupError(
                f"the run's LLM calls were made with the {' and '.join(wanted)} APIs, and one "
                f"{what} cannot serve both: give one per API (on the command line "
                f"{' '.join(f'{option} {name}=URL' for name in wanted)})"
            )
        return dict.fromkeys(wanted, given)
    unknown = sorted(set(given) - set(APIS))
    if unknown:
        raise ReexecuteSetupError(
            f"a {what} was given for {', '.join(map(repr, unknown))}, which is not an API "
            f"re-execution speaks ({', '.join(APIS)})"
        )
    missing = [name for name in wanted if name not in given]
    if missing:
        raise ReexecuteSetupError(
            f"the run's LLM calls were made with the {' and '.join(missing)} API and no "
            f"{what} was given for it (on the command line {option} {missing[0]}=...)"
        )
    return {name: given[name] for name in wanted}
