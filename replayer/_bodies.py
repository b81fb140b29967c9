"""Recorded bodies, opened for a person to read: with a stated purpose, one access audit
row per body, read from the topic through the run index (one body, or several of a run
in one pass)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from agent_blackbox.keystore import (
    AesGcmSealer,
    AuditedKeys,
    LocalKeyProvider,
    request_access,
)
from agent_blackbox.replayer._index import RunIndex
from agent_blackbox.replayer._sources import KafkaRunSource
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    EventType,
    PayloadPipeline,
    PlaintextInSealedRun,
    SealedRunGuard,
    Settings,
    llm_reply,
)


@dataclass(frozen=True, slots=True)
class OpenedBody:
    """What reading one event's body gave: the body as a reader wants it, or why there
    is none to show (never both)."""

    envelope: Envelope
    body: dict[str, Any] | None
    withheld: str | None


def open_body(
    settings: Settings,
    engine: Engine,
    index: RunIndex,
    run_id: str,
    sequence: int,
    *,
    purpose: str,
    timeout_s: float = 15.0,
) -> OpenedBody:
    """The body of event ``sequence`` of ``run_id``, for a person to read.

    The run is located through ``index`` as the login sees it (another tenant's run is
    not there, and nothing is audited). Then the access audit's request row is written
    (``purpose``, the database login), so an opening leaves exactly one request row
    whatever follows; a sealed run's data key is then unwrapped through the audited
    functions (which add the unwrap's own row). The run is read from the topic up to
    that event, so a plaintext body appended to a sealed run by someone other than its
    recorder is withheld, as replay refuses it.

    A person waits on it: the topic read gives up after ``timeout_s`` without a message.

    Raises:
        AccessDenied: the purpose is unusable, or the login may not read the run.
        SourceError: the run is not indexed, or the topic cannot be read.
        BlackboxError: the event is not in the topic where the index says.
    """
    opened = open_bodies(
        settings, engine, index, run_id, (sequence,), purpose=purpose, timeout_s=timeout_s
    )
    return opened[0]


def open_bodies(
    settings: Settings,
    engine: Engine,
    index: RunIndex,
    run_id: str,
    sequences: Sequence[int],
    *,
    purpose: str,
    timeout_s: float = 15.0,
) -> list[OpenedBody]:
    """The bodies of events ``sequences`` of ``run_id``, in sequence order, read in one
    pass over the run in the topic: what one stated purpose opens at once.

    As :func:`open_body` for each of them: the run is located first (a run the login's
    index does not show is refused before anything is audited), then one access audit
    request row per body is written (each with ``purpose``) before the topic is read, so
    the audit counts every body shown; a sealed run's data keys are unwrapped through
    the audited functions once each.

    Raises:
        AccessDenied: the purpose is unusable, or the login may not read the run.
        SourceError: the run is not indexed, or the topic cannot be read.
        BlackboxError: an event is not in the topic where the index says.
    """
    wanted = sorted(set(sequences))
    if not wanted:
        return []
    source = KafkaRunSource(settings, index, run_id, timeout_s=timeout_s)
    pipeline = _audited_pipeline(engine, run_id, purpose=purpose, bodies=len(wanted))
    guard = SealedRunGuard()
    events = iter(source)
    earlier: dict[int, Envelope] = {}  # the llm.calls a request stored by reference names
    opened: list[OpenedBody] = []
    try:
        for envelope in events:
            refusal = guard.refusal(envelope)
            if envelope.sequence == wanted[len(opened)]:
                opened.append(_opened_in_run(envelope, pipeline, earlier, refusal))
                if len(opened) == len(wanted):
                    return opened
            elif envelope.sequence > wanted[len(opened)]:
                break
            if envelope.event_type == EventType.LLM_CALL and refusal is None:
                earlier[envelope.sequence] = envelope
    finally:
        getattr(events, "close", lambda: None)()  # the topic reader stops at once
    raise BlackboxError(f"run {run_id} has no event {wanted[len(opened)]} in the topic")


def _audited_pipeline(engine: Engine, run_id: str, *, purpose: str, bodies: int) -> PayloadPipeline:
    """The pipeline that opens ``run_id``'s bodies, after ``bodies`` access request rows
    were written (committed each): with this process's key-encryption keys, its data
    keys are unwrapped against the first of them."""
    provider = LocalKeyProvider.from_env()
    if provider is None:
        pipeline = PayloadPipeline()
    else:
        keys = AuditedKeys(engine, provider, purpose=purpose)
        keys.request_access(run_id)
        bodies -= 1
        pipeline = PayloadPipeline(sealer=AesGcmSealer(keys))
    for _ in range(bodies):
        request_access(engine, purpose=purpose, run_id=run_id)
    return pipeline


def _opened_in_run(
    envelope: Envelope,
    pipeline: PayloadPipeline,
    earlier: Mapping[int, Envelope],
    refusal: PlaintextInSealedRun | None,
) -> OpenedBody:
    if refusal is not None:
        return OpenedBody(
            envelope,
            None,
            f"refused: a plaintext body in a run sealed under data key "
            f"{refusal.key_id} since sequence {refusal.sealed_at}, not written "
            "by the run's recorder",
        )
    return _opened(envelope, pipeline, earlier)


def _opened(
    envelope: Envelope, pipeline: PayloadPipeline, earlier: Mapping[int, Envelope]
) -> OpenedBody:
    if envelope.payload is None:
        return OpenedBody(
            envelope,
            None,
            f"stored out of line ({envelope.payload_ref}); read it with `blackbox replay` "
            "or `blackbox export --bodies`",
        )
    try:
        body = pipeline.unpack_in_run(envelope, earlier)
    except BlackboxError as exc:  # a destroyed key, a missing one, a corrupt body
        return OpenedBody(envelope, None, f"{type(exc).__name__}: {exc}")
    return OpenedBody(envelope, readable_body(envelope.event_type, body), None)


def readable_body(event_type: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as a person reads it: every ``*_json`` text field of the body's own
    structure, at any depth, parsed into the value it holds (a raw request is shown as
    JSON, not as a string of JSON), and an LLM call's answer (its choices and tool
    calls) first."""
    parsed = _parsed(dict(body))
    if event_type != EventType.LLM_CALL:
        return dict(parsed)
    first = answer_first(body)
    shown = {"choices": first["choices"], "tool_calls": first["tool_calls"], **parsed}
    shown["tool_calls"] = _parsed(shown["tool_calls"])
    return shown


def answer_first(body: Mapping[str, Any]) -> dict[str, Any]:
    """An LLM call's body as a reader wants it first: the answer (choices and tool
    calls, derived from the raw response), then the rest of the body."""
    reply = llm_reply(dict(body))
    return {"choices": list(reply.choices), "tool_calls": list(reply.tool_calls), **body}


def _parsed(value: Any) -> Any:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, item in value.items():
            if isinstance(name, str) and name.endswith("_json") and isinstance(item, str):
                try:
                    # What the text held is shown as it is: recorded data, not our fields.
                    out[name.removesuffix("_json")] = json.loads(item)
                    continue
                except ValueError:
                    pass
            out[name] = _parsed(item)
        return out
    if isinstance(value, list):
        return [_parsed(item) for item in value]
    return value
