"""What a run did, in one shape for a recorded run and for the variant made of it: the
thing an experiment's evaluators score.

The recorded side is read from the run's bodies; the variant's from what its fork (or
its re-sent LLM calls) answered, scrubbed under the recorded run's redaction rules, so
that the two compare like with like: the recorded run's values were redacted when they
were written, and the variant's are redacted the same way before anyone looks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from agent_blackbox.outbox import completion_view
from agent_blackbox.outbox.contract import Scrub
from agent_blackbox.replayer._fork import ForkResult, LlmUse
from agent_blackbox.replayer._fork_diff import llm_summary, recorded_response
from agent_blackbox.replayer._opening import BlobReader
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    EventType,
    PayloadPipeline,
    canonical_text,
    refusing_plaintext,
)

Pricing = Callable[[str, str, Mapping[str, Any] | None], Decimal | None]
"""``pricing(provider, model, usage)``: what a call that reported ``usage`` (the
provider's usage JSON) cost in US dollars, or None when that cannot be known (no price
for the model, no usage reported). The read side's price table is one
(``agent_blackbox.consumers.priced_calls``)."""


@dataclass(frozen=True, slots=True)
class LlmCall:
    """One LLM call of a run: what was asked, what came back, how long it took, what it
    cost."""

    provider: str
    model: str
    request: Mapping[str, Any] | None
    """The raw request (None when the recording kept none: a body over the ceiling)."""
    response: Mapping[str, Any] | None
    """The provider's raw answer (None when the call failed)."""
    error: str | None = None
    """``"Type: message"`` when the call failed."""
    latency_ms: float | None = None
    cost_usd: Decimal | None = None
    """Its cost by the experiment's prices; None when unknown (or the call failed)."""

    @property
    def answer(self) -> dict[str, Any]:
        """The answer's content: ``text`` and ``finish_reason`` per choice, ``tool_calls``
        (name and parsed arguments) per choice, ``usage``; ids and times left out."""
        return llm_summary(self.response)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a run, with its arguments and result as recorded."""

    tool: str
    arguments: Any
    result: Any = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run did, as an evaluator sees it (the recorded run, or its variant).

    ``has_output`` is False for a variant that re-sent the recorded LLM calls without
    running the agent (``--reexecute``): it has LLM calls and no output of its own.
    """

    run_id: str
    status: str
    output: Any = None
    error: str | None = None
    llm_calls: tuple[LlmCall, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    duration_ms: float | None = None
    input: Any = None
    changes: Mapping[str, str] = field(default_factory=dict)
    """What the variant changed (empty for the recorded run)."""
    has_output: bool = True

    @property
    def cost_usd(self) -> Decimal | None:
        """What its LLM calls cost; None when a call that did not fail has no known cost
        (a partial sum would read as the whole)."""
        total = Decimal(0)
        for call in self.llm_calls:
            if call.error is not None:
                continue  # a failed call is not billed
            if call.cost_usd is None:
                return None
            total += call.cost_usd
        return total

    @property
    def llm_latency_ms(self) -> float | None:
        """The summed latency of its LLM calls; None without a timed call."""
        timed = [c.latency_ms for c in self.llm_calls if c.latency_ms is not None]
        return sum(timed) if timed else None


class OutcomeError(BlackboxError):
    """A recorded run cannot be read as an outcome: it has no ``run.started`` or
    ``run.finished``, or a body of it cannot be opened."""


def recorded_outcome(
    events: Iterable[Envelope],
    *,
    pipeline: PayloadPipeline | None = None,
    pricing: Pricing | None = None,
    blobs: BlobReader | None = None,
) -> Outcome:
    """The outcome of a recorded run, from its events (opened with ``pipeline``; bodies
    stored out of line read through ``blobs``), its LLM calls priced by ``pricing``.

    Raises:
        OutcomeError: the run did not start or did not finish in these events.
    """
    reading = _Reading(pipeline or PayloadPipeline(), blobs, pricing)
    envelopes = list(refusing_plaintext(events))
    if not envelopes or envelopes[0].event_type != EventType.RUN_STARTED:
        raise OutcomeError("the run does not start with run.started; it cannot be scored")
    # The end is run.finished, wherever it is: retention may append run.redacted after.
    ends = [e for e in envelopes if e.event_type == EventType.RUN_FINISHED]
    if not ends:
        raise OutcomeError(
            f"run {envelopes[0].run_id} has not finished (no run.finished among its "
            f"{len(envelopes)} events); score finished runs only"
        )
    finished = ends[-1]
    started = reading.body(envelopes[0])
    end = reading.body(finished)
    took = (finished.recorded_at - envelopes[0].recorded_at).total_seconds() * 1000
    return Outcome(
        run_id=envelopes[0].run_id,
        status=str(end["status"]),
        output=json.loads(end["output_json"] or "null"),
        error=_error_of(end),
        llm_calls=tuple(reading.llm_calls(envelopes)),
        tool_calls=tuple(reading.tool_calls(envelopes)),
        duration_ms=took,
        input=json.loads(started["input_json"]),
    )


@dataclass(frozen=True, slots=True)
class _Reading:
    pipeline: PayloadPipeline
    blobs: BlobReader | None
    pricing: Pricing | None

    def body(self, envelope: Envelope) -> dict[str, Any]:
        if envelope.payload is None and envelope.payload_ref is not None:
            if self.blobs is None:
                raise OutcomeError(
                    f"event {envelope.sequence} of run {envelope.run_id} is stored out of "
                    "line and no blob reader was given"
                )
            return dict(self.pipeline.unpack(envelope, self.blobs.read(envelope.payload_ref)))
        return dict(self.pipeline.unpack(envelope))

    def llm_calls(self, envelopes: Sequence[Envelope]) -> Iterable[LlmCall]:
        for envelope in envelopes:
            if envelope.event_type != EventType.LLM_CALL:
                continue
            body = self.body(envelope)
            raw = body.get("raw_request_json")
            call = LlmCall(
                provider=str(body["provider"]),
                model=str(body["model"]),
                request=None if raw is None else json.loads(raw),
                response=recorded_response(body),
                error=_error_of(body),
                latency_ms=body.get("latency_ms"),
            )
            yield priced(call, self.pricing)

    def tool_calls(self, envelopes: Sequence[Envelope]) -> Iterable[ToolCall]:
        for envelope in envelopes:
            if envelope.event_type != EventType.TOOL_CALL:
                continue
            body = self.body(envelope)
            result = body.get("result_json")
            yield ToolCall(
                tool=str(body["tool"]),
                arguments=json.loads(body["arguments_json"]),
                result=None if result is None else json.loads(result),
                error=_error_of(body),
            )


def priced(call: LlmCall, pricing: Pricing | None) -> LlmCall:
    """``call`` with its cost by ``pricing`` (none for a failed call, or without prices)."""
    if pricing is None or call.error is not None or call.response is None:
        return call
    usage = completion_view(call.response).get("usage")
    return replace(call, cost_usd=pricing(call.provider, call.model, usage))


def forked_outcome(
    result: ForkResult, recorded: Envelope, *, pricing: Pricing | None = None
) -> Outcome:
    """The outcome of a fork, its values scrubbed under the redaction rules its parent
    was recorded with (``recorded``: the parent's ``run.started``), its LLM calls priced
    by ``pricing``."""
    scrub = Scrub.recorded_in(recorded.attributes)
    calls = tuple(priced(_llm_call(use, scrub), pricing) for use in result.llm_calls)
    tools = tuple(
        ToolCall(use.tool, use.arguments, use.result, use.error) for use in result.tool_calls
    )
    return Outcome(
        run_id=result.run_id,
        status=result.status,
        output=_as_recorded(scrub.value(result.output, set())),
        error=result.error,
        llm_calls=calls,
        tool_calls=tools,
        duration_ms=result.duration_ms,
        changes=dict(result.changes),
    )


def _llm_call(use: LlmUse, scrub: Scrub) -> LlmCall:
    return LlmCall(
        provider=use.provider or "unknown",
        model=use.model,
        request=None if use.request is None else _as_recorded(scrub.value(use.request, set())),
        response=None if use.response is None else _as_recorded(scrub.value(use.response, set())),
        error=use.error,
        latency_ms=use.latency_ms,
    )


def _as_recorded(value: Any) -> Any:
    """``value`` as a recording keeps it: its canonical JSON, read back (a tuple is a
    list, a key is a string); as it is when it has no JSON form."""
    try:
        return json.loads(canonical_text(value, path="output"))
    except (BlackboxError, TypeError, ValueError):
        return value


def _error_of(body: Mapping[str, Any]) -> str | None:
    error = body.get("error")
    return None if error is None else f"{error['type']}: {error['message']}"
