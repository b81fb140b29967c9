"""What each boundary's crossing records, and what a replay hands back from it.

Both halves of every boundary kind are here, side by side. A *builder* turns what came of
a boundary call (its value or its exception, and its latency) into the crossing record
mode appends: the body, the input and output that are digested, the attributes. A
*reader* turns the recorded crossing back into what came of the call, as replay mode
hands it to the code: it returns the value with its type, or raises the exception with
its class. Each is
built from the boundary's :class:`~agent_blackbox.outbox.contract.Ask` alone (what the
code asked, already scrubbed and digested), so the steps of ``_steps.py`` name a builder
and a reader and carry no closure of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from agent_blackbox.outbox import _boundaries as b
from agent_blackbox.outbox._asks import Ask, Contract
from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._effects import EffectOutcome, EffectReceipt
from agent_blackbox.outbox._errors import EffectRejected, NotSerialisable
from agent_blackbox.outbox._llm import llm_call
from agent_blackbox.outbox._scrub import Scrub


class Done(NamedTuple):
    """What came of a boundary call in record mode: its value or its exception, and how
    long it took."""

    value: Any
    error: BaseException | None = None
    latency_ms: float = 0.0

    def result(self) -> Any:
        """The value, or the exception raised again."""
        if self.error is not None:
            raise self.error
        return self.value


Build = Callable[[Contract, Ask, Any, "BaseException | None", float], Crossing]
"""Record mode: the crossing of ``ask`` from what its call returned or raised."""

Outcome = Callable[[Any, "BaseException | None", float], Crossing]
"""A :data:`Build` with its contract and ask bound (an open crossing's, settled later)."""


class Restore(Protocol):
    """How replay rebuilds what a body recorded: values with their types, errors with
    their classes (the replayer's, which knows the modules that stand in for recorded ones)."""

    def value(self, value: Any, codec: str | None) -> Any:
        """A recorded value with its type again (plain JSON without a codec)."""
        ...

    def error(self, info: Mapping[str, str]) -> BaseException:
        """The exception a recorded error stands for."""
        ...


Read = Callable[[Restore, dict[str, Any], Any], Any]
"""Replay mode: what a call returned, from its recorded body and output; raises what it
raised."""


def _asked(
    scrub: Scrub, crossing: Crossing, ask: Ask, fired: set[str] | frozenset[str]
) -> Crossing:
    """``crossing`` with the input digest its ask took and the rules that fired."""
    return scrub.mark(crossing.with_input_digest(ask.input_digest), set(fired))


# Calls of the agent's functions ------------------------------------------------------


def tool_call(
    contract: Contract, ask: Ask, result: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``tool.call``: the result in its recorded form, or the error (also a result that
    cannot be recorded, raised to the agent once appended)."""
    scrub, tool = contract.scrub, ask.input["tool"]
    args, kwargs = ask.value
    seen = set(ask.fired)
    result, refused = recordable(scrub, result, error, seen, path=f"{tool}.result")
    built = b.tool_call(
        tool=tool,
        args=args,
        kwargs=kwargs,
        result=result,
        error=scrub.error(refused or error, seen),
        latency_ms=latency_ms,
    )
    return _asked(scrub, built, ask, seen).raising(refused)


def tool_result(restore: Restore, body: dict[str, Any], output: Any) -> Any:
    """A tool's recorded result with its type; raises its recorded error."""
    if output["error"] is not None:
        raise restore.error(output["error"])
    return restore.value(output["result"], body.get("result_codec"))


def retrieval(
    contract: Contract, ask: Ask, hits: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``retrieval``: the hits, or the error (also hits that are not hits, or cannot be
    recorded: raised to the agent once appended)."""
    scrub, inputs = contract.scrub, ask.input
    index = inputs["index"]
    query, filters = ask.value
    seen = set(ask.fired)
    refused = None if error is not None else _invalid_hits(index, hits)
    encoded, unrecordable = recordable(scrub, hits, error or refused, seen, path=f"{index}.hits")
    refused = refused or unrecordable
    built = b.retrieval(
        index=index,
        index_version=inputs["index_version"],
        query=query,
        filters=filters,
        top_k=inputs["top_k"],
        hits=encoded,
        error=scrub.error(refused or error, seen),
        latency_ms=latency_ms,
    )
    return _asked(scrub, built, ask, seen).raising(refused)


def retrieval_hits(restore: Restore, body: dict[str, Any], output: Any) -> Any:
    """A retrieval's recorded hits with their types; raises its recorded error."""
    if output["error"] is not None:
        raise restore.error(output["error"])
    return restore.value(output["hits"], body.get("hits_codec"))


def llm(
    contract: Contract, ask: Ask, response: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``llm.call``: the request as scrubbed, the response or the error (also a response
    that cannot be recorded, such as a text with a lone surrogate: raised to the agent
    once appended, as a tool's result that cannot be, so the run still replays)."""
    scrub, seen = contract.scrub, set(ask.fired)
    refused = None
    try:
        built = _llm_built(contract, ask, response, error, latency_ms, seen)
    except NotSerialisable as exc:
        refused = b.unserialisable(exc)
        seen = set(ask.fired)
        built = _llm_built(contract, ask, None, refused, latency_ms, seen)
    if refused is not None:
        # What llm.call recorded of it, which replay raises again (see below).
        refused.__dict__["recorded_error"] = built.body["error"]
    elif error is not None:
        # The error carries what llm.call recorded of it, so a
        # run that ends on it records the same error in replay as here.
        error.__dict__.setdefault("recorded_error", built.body["error"])
    return _asked(scrub, built, ask, seen).raising(refused)


def _llm_built(
    contract: Contract,
    ask: Ask,
    response: Any,
    error: BaseException | None,
    latency_ms: float,
    seen: set[str],
) -> Crossing:
    scrub = contract.scrub
    return llm_call(
        provider=ask.input["provider"],
        model=ask.input["model"],
        request=ask.value,
        response=None if response is None else scrub.response(response, seen),
        error=scrub.error(error, seen),
        latency_ms=latency_ms,
        parts=contract.requests.parts_of(ask.value),
    )


def llm_response(restore: Restore, body: dict[str, Any], output: Any) -> Any:
    """A model's recorded response (its raw JSON); raises its recorded error."""
    if output["error"] is not None:
        raise restore.error(output["error"])
    return output["response"]


def receipt(
    contract: Contract, ask: Ask, value: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``effect.receipt``: confirmed (with what ``perform`` returned), failed (rejected for
    sure) or unknown (anything else it raised)."""
    effect, key = ask.input["effect"], ask.input["idempotency_key"]
    outcome = as_outcome(value)
    if error is None:
        status = "confirmed"
        external_id = outcome.external_id if outcome else None
        result = outcome.result if outcome else None
    elif isinstance(error, EffectRejected):
        status, external_id, result = "failed", error.external_id, None
    else:
        status, external_id, result = "unknown", None, None
    scrub, fired = contract.scrub, set[str]()
    recorded, refused = recordable(scrub, result, error, fired, path=f"{effect}.result")
    built = b.effect_receipt(
        effect=effect,
        idempotency_key=key,
        status=status,
        external_id=external_id,
        result=recorded,
        error=scrub.error(refused or error, fired),
        latency_ms=latency_ms,
    )
    return scrub.mark(built.with_input_digest(ask.input_digest).raising(refused), fired)


def recorded_receipt(restore: Restore, body: dict[str, Any], output: Any) -> Any:
    """What an effect's recorded receipt says came of it: its outcome; raises the
    rejection (``failed``) or the error ``perform`` raised (``unknown``, or a result that
    was not recorded). A receipt of another status without an error (written by no
    recorder of ours) comes back whole."""
    status = output["status"]
    if status == "failed":
        message = (output["error"] or {}).get("message", "rejected")
        raise EffectRejected(message, external_id=output["external_id"])
    if output["error"] is not None:
        raise restore.error(output["error"])
    result = restore.value(output["result"], body.get("result_codec"))
    if status == "confirmed":
        return EffectOutcome(external_id=output["external_id"], result=result)
    effect, key = body["effect"], body["idempotency_key"]
    return EffectReceipt(effect, key, status, output["external_id"], result)


def receipt_of(effect: str, key: str, value: Any) -> EffectReceipt:
    """The receipt of an effect whose call returned ``value`` (what ``perform`` returned,
    or, in replay, the recorded outcome)."""
    if isinstance(value, EffectReceipt):
        return value
    outcome = as_outcome(value)
    external_id = outcome.external_id if outcome else None
    return EffectReceipt(effect, key, "confirmed", external_id, outcome.result if outcome else None)


def as_outcome(value: EffectOutcome | Mapping[str, Any] | None) -> EffectOutcome | None:
    """Accept an :class:`EffectOutcome`, a mapping with ``external_id``/``result``, or None."""
    if value is None or isinstance(value, EffectOutcome):
        return value
    return EffectOutcome(external_id=value.get("external_id"), result=value.get("result"))


# Reads of the world: clocks and randomness --------------------------------------------


def clock_read(
    contract: Contract, ask: Ask, value_us: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``clock.read``: a reading in microseconds."""
    read = b.clock_read(clock=ask.input["clock"], value_us=value_us)
    return read.with_input_digest(ask.input_digest)


def clock_value(restore: Restore, body: dict[str, Any], output: Any) -> Any:
    """A recorded clock reading, in microseconds."""
    return output["value_us"]


def random_draw(
    contract: Contract, ask: Ask, value: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``random.draw`` of a float or an integer."""
    kind, arguments = ask.input["kind"], ask.input["arguments"]
    draw = b.random_draw(kind=kind, arguments=arguments, value=value)
    return draw.with_input_digest(ask.input_digest)


def uuid_draw(
    contract: Contract, ask: Ask, value: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``random.draw`` of a UUID, recorded as its text."""
    return random_draw(contract, ask, str(value), error, latency_ms)


def drawn_float(restore: Restore, body: dict[str, Any], output: Any) -> float:
    """A recorded float draw."""
    return float(output["value"])


def drawn_int(restore: Restore, body: dict[str, Any], output: Any) -> int:
    """A recorded integer draw."""
    return int(output["value"])


def drawn_uuid(restore: Restore, body: dict[str, Any], output: Any) -> uuid.UUID:
    """A recorded UUID draw."""
    return uuid.UUID(output["value"])


# Crossings the code decides alone ------------------------------------------------------


def intent(
    contract: Contract, ask: Ask, value: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``effect.intent``: the effect, its key and its arguments as scrubbed."""
    inputs = ask.input
    built = b.effect_intent(
        effect=inputs["effect"], idempotency_key=inputs["idempotency_key"], arguments=ask.value
    )
    return _asked(contract.scrub, built, ask, ask.fired)


def transition(
    contract: Contract, ask: Ask, value: Any, error: BaseException | None, latency_ms: float
) -> Crossing:
    """``state.transition``: the state as scrubbed is its output."""
    inputs = ask.input
    moved = b.state_transition(
        from_state=inputs["from_state"],
        to_state=inputs["to_state"],
        state=ask.value,
        reason=inputs["reason"],
    )
    return _asked(contract.scrub, moved, ask, ask.fired)


def state_digest(contract: Contract, ask: Ask) -> str:
    """The output digest of a transition the code asks for: over the state it sets."""
    return contract.state_digest(ask, ask.input["to_state"])


# What a result must be to be recorded --------------------------------------------------


def recordable(
    scrub: Scrub, result: Any, error: BaseException | None, fired: set[str], *, path: str
) -> tuple[Any, BaseException | None]:
    """A result in its recorded form (tagged, scrubbed), or, when it cannot be recorded,
    None and the refusal to record as the crossing's error and raise to the agent."""
    if error is not None or result is None:
        return None, None
    try:
        return scrub.encoded(result, fired, path=path), None
    except NotSerialisable as exc:
        return None, b.unserialisable(exc)


def _invalid_hits(index: str, hits: Any) -> BaseException | None:
    """Why ``hits`` are not a retrieval's answer (a list of mappings, each with an ``id``
    and a numeric ``score``), or None."""
    if not isinstance(hits, list):
        return TypeError(f"the search of index {index!r} returned {type(hits).__name__}, not hits")
    for position, hit in enumerate(hits):
        if not isinstance(hit, Mapping) or "id" not in hit:
            return ValueError(
                f"hit {position} of index {index!r} has no 'id': a search returns mappings "
                "with at least 'id' (the document) and 'score' (and, if chunked, "
                "'chunk_version')"
            )
        score = hit.get("score")
        if isinstance(score, bool) or not isinstance(score, int | float):
            return ValueError(f"hit {position} of index {index!r} has no numeric 'score'")
    return None
