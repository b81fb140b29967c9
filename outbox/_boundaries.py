"""What each boundary kind records: its body, the inputs and outputs that are digested,
and the unsealed attributes views index on.

The same functions serve record mode and replay: replay recomputes the input part from
the call the agent makes now and compares its digest with the recorded one, so the
input of a boundary is exactly what the agent code decides, and nothing it receives.

A value replay hands back to the code (a run's input, a tool's result, retrieval hits,
an effect's result, an LLM response) is stored as ordered JSON, each mapping's keys in
the order the code first got them: code that writes one out (``json.dumps(result)`` in
its next request) writes the same text in replay. Everything else a body holds (inputs,
states, the run's output, errors) stays canonical JSON. Digests are taken over the
canonical JSON of the values either way, so they do not depend on which was stored;
bodies written before ordered JSON hold canonical JSON and read the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_blackbox.outbox._placement import Place
from agent_blackbox.outbox._values import TAGGED, describe_error
from agent_blackbox.schemas import (
    REDACTED_SIGNED_VERSION,
    EventType,
    canonical_text,
    encoded_parts,
    ordered_text,
)

VERSION = 1
"""Body version the builders here write, unless they name another."""
TYPED_VERSION = 2
"""Body version of ``run.started``, ``tool.call``, ``effect.receipt`` and ``run.finished``:
errors carry their module and arguments, and values are written in the tagged encoding
of :mod:`agent_blackbox.outbox._values` (marked by the body's ``*_codec`` field)."""
UNSERIALISABLE_RESULT = "unserialisable_result"
"""The ``kind`` of the error recorded for a result that cannot be recorded."""


@dataclass(frozen=True, slots=True)
class Crossing:
    """One boundary crossing, ready to be turned into an envelope."""

    event_type: EventType
    body: dict[str, Any]
    input: Any
    """The JSON the input digest is taken over."""
    output: Any
    """The JSON the output digest is taken over."""
    attributes: dict[str, str] = field(default_factory=dict)
    version: int = VERSION
    input_digest: str | None = None
    """The digest of :attr:`input`, when it was already taken (by the pre-call check)."""
    place: Place | None = None
    """Where the crossing began among the run's concurrent work (see ``_placement``)."""
    raises: BaseException | None = field(default=None, compare=False)
    """Raised to the agent once the crossing is appended (a result that could not be
    recorded is recorded as an error, and the agent gets that error)."""

    # Copies with one field changed. A crossing is copied three or four times on its way
    # to the log (its input digest, its place, what it raises); ``dataclasses.replace``
    # walks the fields for each, and that was 5% of a buffered event's CPU.

    def with_input_digest(self, input_digest: str | None) -> Crossing:
        """This crossing, with ``input_digest``."""
        return self._copy(self.attributes, input_digest, self.place, self.raises)

    def with_attributes(self, attributes: dict[str, str]) -> Crossing:
        """This crossing, with ``attributes``."""
        return self._copy(attributes, self.input_digest, self.place, self.raises)

    def placed(self, place: Place | None) -> Crossing:
        """This crossing, begun at ``place``."""
        return self._copy(self.attributes, self.input_digest, place, self.raises)

    def raising(self, raises: BaseException | None) -> Crossing:
        """This crossing, raising ``raises`` once appended."""
        return self._copy(self.attributes, self.input_digest, self.place, raises)

    def _copy(
        self,
        attributes: dict[str, str],
        input_digest: str | None,
        place: Place | None,
        raises: BaseException | None,
    ) -> Crossing:
        kind, body, version = self.event_type, self.body, self.version
        return Crossing(
            kind, body, self.input, self.output, attributes, version, input_digest, place, raises
        )


def error_info(exc: BaseException | None) -> dict[str, str] | None:
    """The recorded form of an exception: ``type`` (its qualname), ``message``, and,
    when known, ``module``, ``args_json`` (its typed arguments) and ``kind`` (why the
    recorder made the error, e.g. ``unserialisable_result``). Keys without a value are
    left out, so an error read from an old body has the shape it was recorded with."""
    if exc is None:
        return None
    # In replay, a recorded error travels as such and must be recorded the same way.
    recorded = getattr(exc, "recorded_error", None)
    if isinstance(recorded, dict):
        return {str(k): str(v) for k, v in recorded.items() if v is not None}
    return describe_error(exc)


def plain_error(info: Mapping[str, str] | None) -> dict[str, str] | None:
    """An error as version 1 bodies (and ``llm.call`` v2) record it: type and message."""
    return None if info is None else {"type": info["type"], "message": info["message"]}


def _present(info: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A recorded error without its empty fields (a v1 body read at v2 has them as null)."""
    if info is None:
        return None
    return {k: v for k, v in info.items() if v is not None}


def unserialisable(exc: BaseException) -> BaseException:
    """``exc`` (the refusal of a result that cannot be recorded, naming its path) marked
    as the error the recorder records in the result's place, of kind
    ``unserialisable_result``; the agent gets it too, so a replay raises it again."""
    info = describe_error(exc)
    info["kind"] = UNSERIALISABLE_RESULT
    exc.recorded_error = info  # type: ignore[attr-defined]
    return exc


def run_started(
    *,
    code_version: str,
    input: Any,
    prompt_templates: Mapping[str, str],
    tool_schemas: Mapping[str, str],
    model_ids: tuple[str, ...],
    flags: Mapping[str, str],
    permissions: tuple[str, ...],
    parent_run_id: str | None,
    changes: Mapping[str, str],
) -> Crossing:
    """The input snapshot that opens a run; ``input`` in the tagged encoding."""
    snapshot = {
        "code_version": code_version,
        "input": input,
        "prompt_templates": dict(prompt_templates),
        "tool_schemas": dict(tool_schemas),
        "model_ids": list(model_ids),
        "flags": dict(flags),
        "permissions": list(permissions),
        "parent_run_id": parent_run_id,
        "changes": dict(changes),
    }
    body = {
        "code_version": code_version,
        "input_json": ordered_text(input, path="input"),
        "prompt_templates": [{"id": k, "digest": v} for k, v in sorted(prompt_templates.items())],
        "tool_schemas": [{"name": k, "version": v} for k, v in sorted(tool_schemas.items())],
        "model_ids": list(model_ids),
        "flags": dict(flags),
        "permissions": list(permissions),
        "parent_run_id": parent_run_id,
        "changes": dict(changes),
        "input_codec": TAGGED,
    }
    attributes = {"code_version": code_version}
    if parent_run_id is not None:
        attributes["parent_run_id"] = parent_run_id
    if prompt_templates:
        # Which prompt templates, by id and a short form of their digest: the version of
        # each template the run used, for analytics without a data key.
        attributes["prompt_templates"] = ",".join(
            f"{name}@{str(value).rpartition(':')[2][:12]}"
            for name, value in sorted(prompt_templates.items())
        )[:500]
    return Crossing(EventType.RUN_STARTED, body, snapshot, {}, attributes, TYPED_VERSION)


def tool_input(tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The digested input of a tool call."""
    return {"tool": tool, "args": list(args), "kwargs": dict(kwargs)}


def tool_call(
    *,
    tool: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    result: Any,
    error: BaseException | None,
    latency_ms: float,
) -> Crossing:
    """A finished tool call, successful or not; ``result`` in the tagged encoding."""
    inputs = tool_input(tool, args, kwargs)
    err = error_info(error)
    body = {
        "tool": tool,
        "arguments_json": canonical_text(inputs, path=f"{tool}.arguments"),
        "result_json": None if error else ordered_text(result, path=f"{tool}.result"),
        "result_codec": TAGGED,
        "error": err,
        "latency_ms": latency_ms,
    }
    attributes = {"tool": tool, "latency_ms": f"{latency_ms:.3f}"}
    if err:
        attributes["error"] = err["type"]
    outputs = {"result": None if error else result, "error": err}
    return Crossing(EventType.TOOL_CALL, body, inputs, outputs, attributes, TYPED_VERSION)


def retrieval_input(
    index: str,
    index_version: str,
    query: Any,
    filters: Mapping[str, Any] | None,
    top_k: int | None,
) -> dict[str, Any]:
    """The digested input of a retrieval: what the code asked of which index version."""
    return {
        "index": index,
        "index_version": index_version,
        "query": query,
        "filters": None if filters is None else dict(filters),
        "top_k": top_k,
    }


def retrieval(
    *,
    index: str,
    index_version: str,
    query: Any,
    filters: Mapping[str, Any] | None,
    top_k: int | None,
    hits: list[Any] | None,
    error: BaseException | None,
    latency_ms: float,
) -> Crossing:
    """A finished search of a retrieval index; ``hits`` in the tagged encoding."""
    inputs = retrieval_input(index, index_version, query, filters, top_k)
    err = error_info(error)
    body = {
        "index": index,
        "index_version": index_version,
        "query_json": canonical_text(query, path=f"{index}.query"),
        "filters_json": None if filters is None else canonical_text(dict(filters)),
        "top_k": top_k,
        "hits_json": None if error or hits is None else ordered_text(hits, path=f"{index}.hits"),
        "hits_codec": TAGGED,
        "error": err,
        "latency_ms": latency_ms,
    }
    attributes = {
        "index": index,
        "index_version": index_version,
        "hits": str(0 if hits is None else len(hits)),
        "latency_ms": f"{latency_ms:.3f}",
    }
    if err:
        attributes["error"] = err["type"]
    outputs = {"hits": None if error else hits, "error": err}
    return Crossing(EventType.RETRIEVAL, body, inputs, outputs, attributes)


def clock_read(*, clock: str, value_us: int) -> Crossing:
    """A read of the wall or the monotonic clock."""
    body = {"clock": clock, "value_us": value_us}
    inputs = clock_input(clock)
    return Crossing(EventType.CLOCK_READ, body, inputs, {"value_us": value_us}, {"clock": clock})


def clock_input(clock: str) -> dict[str, Any]:
    """The digested input of a clock read."""
    return {"clock": clock}


def random_input(kind: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The digested input of a random draw."""
    return {"kind": kind, "arguments": dict(arguments)}


def intent_input(effect: str, idempotency_key: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The digested input of an effect intent."""
    return {"effect": effect, "idempotency_key": idempotency_key, "arguments": dict(arguments)}


def receipt_input(effect: str, idempotency_key: str) -> dict[str, Any]:
    """The digested input of an effect receipt."""
    return {"effect": effect, "idempotency_key": idempotency_key}


def transition_input(from_state: str | None, to_state: str, reason: str | None) -> dict[str, Any]:
    """The digested input of a state transition."""
    return {"from_state": from_state, "to_state": to_state, "reason": reason}


def finished_input(status: str) -> dict[str, Any]:
    """The digested input of the end of a run."""
    return {"status": status}


def recorded_output(event_type: str, body: Mapping[str, Any]) -> Any:
    """The output a boundary handed back, rebuilt from its recorded body.

    It is exactly what record mode digested as the output, so its digest must equal
    the envelope's ``output_digest``; anything else means the body was altered.
    """
    return recorded(event_type, body)[0]


def recorded_output_json(event_type: str, body: Mapping[str, Any]) -> bytes | None:
    """:func:`recorded_output` as JSON composed from the JSON texts the body already
    holds, for the frequent kinds; None for the others. Replay digests every output:
    this skips re-encoding the value.

    It is the canonical JSON of the output when those texts are canonical: always for
    clock reads, random draws and state transitions, and for a tool's result or hits
    when no mapping in them has its keys out of sorted order (they are stored as ordered
    JSON). So its digest matching the recorded one proves the output; a mismatch proves
    nothing until the value itself is digested."""
    return recorded(event_type, body)[1]


def recorded(event_type: str, body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    """:func:`recorded_output` and :func:`recorded_output_json` in one dispatch (replay
    takes both for every event)."""
    rebuild = _RECORDED.get(event_type)
    return ({}, None) if rebuild is None else rebuild(body)


def recorded_input(event_type: str, body: Mapping[str, Any]) -> Any:
    """The input a boundary was asked for, rebuilt from its recorded body in the shape
    its input digest was taken over; None for kinds whose input says nothing more than
    their type (so a report can show which paths of the input changed)."""
    if event_type == EventType.TOOL_CALL:
        return _loads(body["arguments_json"])
    if event_type == EventType.LLM_CALL:
        request = _loads(body.get("raw_request_json"))
        return {"provider": body["provider"], "model": body["model"], "request": request}
    if event_type == EventType.EFFECT_INTENT:
        arguments = _loads(body["arguments_json"])
        return intent_input(body["effect"], body["idempotency_key"], arguments)
    if event_type == EventType.RANDOM_DRAW:
        return random_input(body["kind"], _loads(body["arguments_json"]) or {})
    if event_type == EventType.RETRIEVAL:
        query, filters = _loads(body["query_json"]), _loads(body.get("filters_json"))
        return retrieval_input(
            body["index"], body["index_version"], query, filters, body.get("top_k")
        )
    if event_type == EventType.STATE_TRANSITION:
        return transition_input(body["from_state"], body["to_state"], body["reason"])
    if event_type == EventType.RUN_FINISHED:
        return finished_input(body["status"])
    return None


def _loads(raw: str | None) -> Any:
    """The value of a JSON text of a body. Those were written canonical or ordered (no
    whitespace), so the C scanner reads them whole from the start; ``json.loads`` (four
    times the cost on these short texts: it also strips whitespace) takes any other
    text, and names what is wrong with an invalid one."""
    if raw is None:
        return None
    try:
        value, end = _scan(raw, 0)
    except StopIteration:
        return json.loads(raw)
    return value if end == len(raw) else json.loads(raw)


_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _tool_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    error, text = _present(body["error"]), body["result_json"]
    head = "null" if error is None else canonical_text(error)
    material = f'{{"error":{head},"result":{text or "null"}}}'.encode()
    return {"result": _loads(text), "error": error}, material


def _retrieval_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    error, text = _present(body["error"]), body["hits_json"]
    head = "null" if error is None else canonical_text(error)
    material = f'{{"error":{head},"hits":{text or "null"}}}'.encode()
    return {"hits": _loads(text), "error": error}, material


def _clock_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    value = body["value_us"]
    return {"value_us": value}, f'{{"value_us":{int(value)}}}'.encode()


def _random_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    text = body["value_json"]
    return {"value": _loads(text)}, f'{{"value":{text or "null"}}}'.encode()


def _state_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    text = body["state_json"]
    return {"state": _loads(text)}, f'{{"state":{text or "null"}}}'.encode()


def _llm_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    text = body.get("raw_response_json")
    truncated = body.get("body_truncated")
    if text is None and truncated is not None:
        text = truncated["reduced_response_json"]  # replay checks it cannot, and says so
    output = {"response": _loads(text), "error": _present(body["error"])}
    return output, _decoded_material(output)


def _decoded_material(output: dict[str, Any]) -> bytes | None:
    """The C encoder's sorted, compact text of an output just decoded from a body (exact
    types, string keys), without the walk that checks a value's types first: the
    canonical JSON of most responses (not of one holding an integral float or a number
    written with an exponent, whose digest then mismatches and the value is digested).
    None where the encoder refuses it."""
    try:
        parts = encoded_parts([output])
        return None if parts is None else parts[0].encode("utf-8")
    except (TypeError, ValueError):  # NaN, an infinity, a lone surrogate
        return None


def _receipt_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    output = {
        "status": body["status"],
        "external_id": body["external_id"],
        "result": _loads(body.get("result_json")),
        "error": _present(body["error"]),
    }
    return output, None


def _finished_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    output = {
        "output": _loads(body.get("output_json")),
        "error": _present(body["error"]),
        "final_state_digest": body["final_state_digest"],
    }
    return output, None


def _redacted_output(body: Mapping[str, Any]) -> tuple[Any, bytes | None]:
    return {"key_ids": list(body["key_ids"])}, None


_RECORDED: dict[str, Callable[[Mapping[str, Any]], tuple[Any, bytes | None]]] = {
    EventType.TOOL_CALL: _tool_output,
    EventType.LLM_CALL: _llm_output,
    EventType.CLOCK_READ: _clock_output,
    EventType.RANDOM_DRAW: _random_output,
    EventType.RETRIEVAL: _retrieval_output,
    EventType.EFFECT_RECEIPT: _receipt_output,
    EventType.STATE_TRANSITION: _state_output,
    EventType.RUN_REDACTED: _redacted_output,
    EventType.RUN_FINISHED: _finished_output,
}


def random_draw(*, kind: str, arguments: Mapping[str, Any], value: Any) -> Crossing:
    """A draw of randomness: a float, an integer range, a UUID."""
    inputs = random_input(kind, arguments)
    body = {
        "kind": kind,
        "arguments_json": canonical_text(dict(arguments), path=f"{kind}.arguments"),
        "value_json": canonical_text(value, path=f"{kind}.value"),
    }
    return Crossing(EventType.RANDOM_DRAW, body, inputs, {"value": value}, {"kind": kind})


def effect_intent(*, effect: str, idempotency_key: str, arguments: Mapping[str, Any]) -> Crossing:
    """The intent of a side effect, committed before the external call."""
    inputs = intent_input(effect, idempotency_key, arguments)
    body = {
        "effect": effect,
        "idempotency_key": idempotency_key,
        "arguments_json": canonical_text(dict(arguments), path=f"{effect}.arguments"),
    }
    attributes = {"effect": effect, "idempotency_key": idempotency_key}
    return Crossing(EventType.EFFECT_INTENT, body, inputs, {}, attributes)


def effect_receipt(
    *,
    effect: str,
    idempotency_key: str,
    status: str,
    external_id: str | None,
    result: Any,
    error: BaseException | None,
    latency_ms: float,
) -> Crossing:
    """What the external system answered for an intent; ``result`` in the tagged encoding."""
    err = error_info(error)
    body = {
        "effect": effect,
        "idempotency_key": idempotency_key,
        "status": status,
        "external_id": external_id,
        "result_json": None if result is None else ordered_text(result, path=f"{effect}.result"),
        "result_codec": TAGGED,
        "error": err,
        "latency_ms": latency_ms,
    }
    outputs = {"status": status, "external_id": external_id, "result": result, "error": err}
    attributes = {"effect": effect, "idempotency_key": idempotency_key, "status": status}
    if external_id is not None:
        attributes["external_id"] = external_id
    inputs = receipt_input(effect, idempotency_key)
    return Crossing(EventType.EFFECT_RECEIPT, body, inputs, outputs, attributes, TYPED_VERSION)


def state_transition(
    *, from_state: str | None, to_state: str, state: Any, reason: str | None
) -> Crossing:
    """The agent's business state moved."""
    body = {
        "from_state": from_state,
        "to_state": to_state,
        "state_json": canonical_text(state, path=f"{to_state}.state"),
        "reason": reason,
    }
    inputs = transition_input(from_state, to_state, reason)
    attributes = {"to_state": to_state}
    if from_state is not None:
        attributes["from_state"] = from_state
    return Crossing(EventType.STATE_TRANSITION, body, inputs, state_output(state), attributes)


def state_output(state: Any) -> dict[str, Any]:
    """The digested output of a state transition: the state the code set."""
    return {"state": state}


def run_finished(
    *, status: str, output: Any, error: BaseException | None, final_state_digest: str | None
) -> Crossing:
    """The end of a run."""
    err = error_info(error)
    body = {
        "status": status,
        "output_json": None if output is None else canonical_text(output, path="output"),
        "error": err,
        "final_state_digest": final_state_digest,
    }
    outputs = finished_output(output, err, final_state_digest)
    attributes = {"status": status}
    if err:
        attributes["error"] = err["type"]
    return Crossing(
        EventType.RUN_FINISHED, body, finished_input(status), outputs, attributes, TYPED_VERSION
    )


def finished_output(
    output: Any, error: Mapping[str, str] | None, final_state_digest: str | None
) -> dict[str, Any]:
    """The digested output of the end of a run: how the code ended it, after which state."""
    return {"output": output, "error": error, "final_state_digest": final_state_digest}


def run_redacted(
    *,
    reason: str,
    key_ids: list[str],
    subject_id: str | None,
    retention_class: str | None,
    signer_key_id: str | None = None,
    signature: bytes | None = None,
) -> Crossing:
    """The note that a run's data keys were destroyed (retention or a deletion request),
    with the retention job's signature over it when the job has a signing key (see
    :func:`agent_blackbox.schemas.deletion_statement`).

    The subject id is not put in the unsealed attributes: the note is readable by anyone
    who can read the topic.
    """
    body = {
        "reason": reason,
        "retention_class": retention_class,
        "subject_id": subject_id,
        "key_ids": sorted(key_ids),
        "signer_key_id": signer_key_id,
        "signature": signature,
    }
    inputs = {"reason": reason, "retention_class": retention_class, "subject_id": subject_id}
    attributes = {"reason": reason, "keys_destroyed": str(len(key_ids))}
    outputs = {"key_ids": sorted(key_ids)}
    return Crossing(
        EventType.RUN_REDACTED, body, inputs, outputs, attributes, REDACTED_SIGNED_VERSION
    )
