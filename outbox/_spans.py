"""OpenTelemetry spans of boundary crossings (opt-in: ``BLACKBOX_OTEL=1`` or a recorder's
``otel=True``), following the GenAI semantic conventions.

Each crossing runs inside a span of its own, so the envelope recorded for it carries that
span's trace and span ids (the writer reads the current span), and the span carries the
event's ``blackbox.run_id``, ``blackbox.sequence`` and ``blackbox.event_id``: a trace
leads to the recorded event and back. Spans hold low-cardinality metadata (model,
provider, token counts, finish reason, tool name); no prompt, reply, argument or result
is put on a span unless content is turned on (``BLACKBOX_OTEL_CONTENT=1``, or a
recorder's ``otel_content=True``). Then an LLM call's span gets
``gen_ai.input.messages``, ``gen_ai.system_instructions`` and ``gen_ai.output.messages``,
a tool call's ``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result``, each as
JSON text of the crossing *as recorded*: after redaction, exactly what the event holds,
cut at :data:`CONTENT_MAX_CHARS`.

A crossing that fails marks its span as failed with the error *as recorded*: its type and
its message after redaction (the message the event holds), on ``error.type``, the status
and one ``exception`` span event. The exception itself is never handed to the SDK (whose
own recording would put the raw message and the whole stack trace on the span); a stack
trace is added only with content on, and then redacted by the run's rules too.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from agent_blackbox.outbox._boundaries import Crossing, error_info
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.schemas import BlackboxError, Envelope, EventType, completion_view, env_flag

OTEL_ENV = "BLACKBOX_OTEL"
OTEL_CONTENT_ENV = "BLACKBOX_OTEL_CONTENT"
TRACER_NAME = "agent_blackbox"
CONTENT_MAX_CHARS = 32 * 1024
"""The longest content attribute put on a span; longer text is cut, ending in ``…``
(trace backends drop or cut long attributes themselves, less visibly)."""

_TOKENS = (
    ("prompt_tokens", "gen_ai.usage.input_tokens"),
    ("completion_tokens", "gen_ai.usage.output_tokens"),
)


def spans_from(setting: bool | None, *, content: bool | None = None) -> BoundarySpans | None:
    """The spans of a recorder: ``setting`` when given, else ``BLACKBOX_OTEL`` (``1``,
    ``true``, ``yes`` or ``on`` turn them on); with content when ``content`` says so,
    else ``BLACKBOX_OTEL_CONTENT``."""
    on = setting if setting is not None else env_flag(OTEL_ENV)
    if content is None:
        content = env_flag(OTEL_CONTENT_ENV)
    return BoundarySpans(content=content) if on else None


class BoundarySpans:
    """Opens a span around each boundary crossing and names it once the crossing's
    event is known; with ``content``, puts the recorded (redacted) content on it too."""

    def __init__(self, tracer: trace.Tracer | None = None, *, content: bool = False) -> None:
        self._tracer = tracer
        self.content = content

    @property
    def tracer(self) -> trace.Tracer:
        # Looked up when first used, so a tracer provider set after the recorder was
        # made (as applications often do) is the one used.
        if self._tracer is None:
            self._tracer = trace.get_tracer(TRACER_NAME)
        return self._tracer

    @contextmanager
    def crossing(
        self, scrub: Scrub | None = None
    ) -> Iterator[Callable[[Envelope, Crossing], Envelope]]:
        """A span around one crossing; what it yields is given each event appended
        inside it with its crossing (and gives the event back), and names and fills the
        span from them.

        Args:
            scrub: the run's redaction, for an error that escapes the span without
                having been recorded (and for a stack trace, with content on); None
                when the run has none yet: such a message is left out.
        """
        # The SDK is never handed the exception: its own recording would put the raw
        # message (and its status description) and the whole stack trace on the span.
        with self.tracer.start_as_current_span(
            "blackbox.crossing",
            kind=SpanKind.CLIENT,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            recorded: list[Mapping[str, str]] = []

            def seen(envelope: Envelope, crossing: Crossing) -> Envelope:
                name, attributes = _described(envelope)
                span.update_name(name)
                span.set_attributes(attributes)
                if self.content:
                    span.set_attributes(_content(envelope.event_type, crossing))
                error = _recorded_error(crossing)
                if error is not None:
                    recorded.append(error)
                return envelope

            try:
                yield seen
            except BaseException as exc:
                error = recorded[-1] if recorded else _scrubbed_error(exc, scrub)
                stack = _stack(exc, error, scrub) if self.content else None
                _failed(span, error, stack)
                raise
            if recorded:  # recorded as failed, and not raised (a run's own failure)
                _failed(span, recorded[-1], None)


def _described(envelope: Envelope) -> tuple[str, dict[str, str | int | list[str]]]:
    """The span name and attributes of ``envelope`` (metadata only)."""
    found = envelope.attributes
    attributes: dict[str, str | int | list[str]] = {
        "blackbox.run_id": envelope.run_id,
        "blackbox.sequence": envelope.sequence,
        "blackbox.event_id": envelope.event_id,
        "blackbox.event_type": str(envelope.event_type),
    }
    if envelope.event_type == EventType.LLM_CALL:
        model = found.get("model", "")
        attributes.update(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": found.get("provider", ""),
                "gen_ai.request.model": model,
            }
        )
        for ours, theirs in _TOKENS:
            if found.get(ours, "").isdigit():
                attributes[theirs] = int(found[ours])
        if found.get("finish_reason"):
            attributes["gen_ai.response.finish_reasons"] = [found["finish_reason"]]
        return f"chat {model}".strip(), attributes
    if envelope.event_type == EventType.TOOL_CALL:
        tool = found.get("tool", "")
        attributes.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool})
        return f"execute_tool {tool}".strip(), attributes
    return f"blackbox {envelope.event_type}", attributes


def _content(event_type: str, crossing: Crossing) -> dict[str, str]:
    """The content attributes of ``crossing`` as recorded (its redacted input and
    output): JSON text, cut at :data:`CONTENT_MAX_CHARS`."""
    found: dict[str, Any] = {}
    if event_type == EventType.LLM_CALL:
        request = crossing.input.get("request") or {}
        turns = request.get("messages", request.get("input"))
        if turns is not None:
            found["gen_ai.input.messages"] = turns
        system = request.get("system", request.get("instructions"))
        if system is not None:
            found["gen_ai.system_instructions"] = system
        response = crossing.output.get("response")
        if response is not None:
            found["gen_ai.output.messages"] = [
                choice.get("message", choice)
                for choice in completion_view(response).get("choices") or []
            ]
    elif event_type == EventType.TOOL_CALL:
        found["gen_ai.tool.call.arguments"] = crossing.input
        found["gen_ai.tool.call.result"] = crossing.output
    return {
        name: _cut(json.dumps(value, ensure_ascii=False, default=str))
        for name, value in found.items()
    }


def _cut(text: str) -> str:
    return text if len(text) <= CONTENT_MAX_CHARS else text[: CONTENT_MAX_CHARS - 1] + "…"


def _recorded_error(crossing: Crossing) -> Mapping[str, str] | None:
    """The error ``crossing`` records (type and redacted message), if it records one."""
    output = crossing.output
    error = output.get("error") if isinstance(output, Mapping) else None
    if isinstance(error, Mapping) and "type" in error:
        return error
    return None


def _scrubbed_error(exc: BaseException, scrub: Scrub | None) -> Mapping[str, str]:
    """``exc`` as a recorded event would hold it: its type, its message redacted by
    ``scrub`` (left out when there is no scrub, or the message cannot be redacted)."""
    info = error_info(exc) or {"type": type(exc).__qualname__, "message": ""}
    message = _redacted(info.get("message", ""), scrub)
    return {"type": info["type"]} if message is None else {"type": info["type"], "message": message}


def _redacted(text: str, scrub: Scrub | None) -> str | None:
    """``text`` after ``scrub``'s rules, or None when it cannot be told safely."""
    if scrub is None:
        return None
    try:
        return str(scrub.value(text, set()))
    except BlackboxError:  # e.g. pseudonym rules without a tenant key: say nothing
        return None


def _stack(exc: BaseException, error: Mapping[str, str], scrub: Scrub | None) -> str | None:
    """The frames ``exc`` went through and its recorded error, redacted as a whole
    (source lines can hold literals too). Chained exceptions are left out: their
    messages were never recorded, so never redacted."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    last = f"{error['type']}: {error['message']}" if error.get("message") else error["type"]
    return _redacted(f"Traceback (most recent call last):\n{frames}{last}\n", scrub)


def _failed(span: Span, error: Mapping[str, str], stack: str | None) -> None:
    """Mark ``span`` failed with ``error`` (as recorded) and, when given, ``stack``."""
    message = error.get("message")
    span.set_attribute("error.type", error["type"])
    span.set_status(Status(StatusCode.ERROR, f"{error['type']}: {message}" if message else None))
    attributes = {"exception.type": error["type"]}
    if message:
        attributes["exception.message"] = message
    if stack:
        attributes["exception.stacktrace"] = stack
    span.add_event("exception", attributes)
