"""Re-execution: re-send each recorded LLM request of a run and compare the answers.

Only the answer's content is compared (text, finish reason, tool calls by name and
parsed arguments, usage); ids, creation times and system fingerprints change on every
call and are left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_blackbox.replayer._fork import ForkError
from agent_blackbox.replayer._fork_diff import llm_summary, recorded_response
from agent_blackbox.schemas import Envelope, EventType, PayloadPipeline, refusing_plaintext

IGNORED_FIELDS = ("id", "created", "system_fingerprint")
"""What differs between two answers to the same request by design: never compared."""

COMPARED_FIELDS = ("text", "finish_reason", "tool_calls", "usage")


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
    send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    *,
    pipeline: PayloadPipeline | None = None,
) -> list[CallDiff]:
    """Re-send every recorded raw LLM request through ``send`` and diff the answers
    (text, finish reason, tool calls by name and parsed arguments, usage), ignoring ids,
    creation times and system fingerprints.

    A streamed call is re-sent streamed, so like is compared with like; a streamed chat
    completion asks for usage in the stream (``stream_options.include_usage``), and
    usage is left out of the comparison when the recording has none. ``send`` returns
    a streamed answer as ``{"stream": [chunk, ...]}``, as the recorder stores one.
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
        request = json.loads(body["raw_request_json"])
        streamed = bool(request.get("stream"))
        try:
            fresh = send(_with_stream_usage(request) if streamed else request)
        except Exception as exc:  # the endpoint's failure is part of the comparison
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


def _reduced(body: Mapping[str, Any]) -> bool:
    return body.get("body_truncated") is not None and body["raw_response_json"] is None


def _with_stream_usage(request: Mapping[str, Any]) -> dict[str, Any]:
    """A streamed chat completion that also asks for its usage (the last chunk); other
    requests as they were (a Responses API stream carries usage in its last event)."""
    if "messages" not in request:
        return dict(request)
    options = {**(request.get("stream_options") or {}), "include_usage": True}
    return {**request, "stream_options": options}


def _uncompared(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, str]:
    if before["usage"] is None:
        return {"usage": "the recording has no usage (a stream that did not ask for it)"}
    if after["usage"] is None:
        return {"usage": "the endpoint sent no usage this time"}
    return {}


def openai_sender(base_url: str, api_key: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """Sends a raw chat-completion or Responses API request with the official SDK
    (``openai`` extra); a streamed request is read to its end and returned as
    ``{"stream": [chunk, ...]}``."""
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise ForkError(
            "re-execution needs the openai SDK: pip install 'agent-blackbox[openai]'"
        ) from exc
    client = OpenAI(base_url=base_url, api_key=api_key)

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        arguments = dict(request)
        endpoint: Any = client.chat.completions if "messages" in arguments else client.responses
        if arguments.get("stream"):
            with endpoint.create(**arguments) as stream:
                return {"stream": [chunk.to_dict(mode="json") for chunk in stream]}
        body: dict[str, Any] = endpoint.create(**arguments).to_dict(mode="json")
        return body

    return send
