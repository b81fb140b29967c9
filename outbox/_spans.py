"""OpenTelemetry spans of boundary crossings (opt-in: ``BLACKBOX_OTEL=1`` or a recorder's
``otel=True``), following the GenAI semantic conventions.

Each crossing runs inside a span of its own, so the envelope recorded for it carries that
span's trace and span ids (the writer reads the current span), and the span carries the
event's ``blackbox.run_id``, ``blackbox.sequence`` and ``blackbox.event_id``: a trace
leads to the recorded event and back. Spans hold low-cardinality metadata only (model,
provider, token counts, finish reason, tool name); no prompt, reply, argument or
result is ever put on a span.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agent_blackbox.schemas import Envelope, EventType

OTEL_ENV = "BLACKBOX_OTEL"
TRACER_NAME = "agent_blackbox"

_TOKENS = (
    ("prompt_tokens", "gen_ai.usage.input_tokens"),
    ("completion_tokens", "gen_ai.usage.output_tokens"),
)


def spans_from(setting: bool | None) -> BoundarySpans | None:
    """The spans of a recorder: ``setting`` when given, else ``BLACKBOX_OTEL`` (``1``,
    ``true``, ``yes`` or ``on`` turn them on)."""
    on = setting
    if on is None:
        on = os.environ.get(OTEL_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return BoundarySpans() if on else None


class BoundarySpans:
    """Opens a span around each boundary crossing and names it once the crossing's
    event is known."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer

    @property
    def tracer(self) -> trace.Tracer:
        # Looked up when first used, so a tracer provider set after the recorder was
        # made (as applications often do) is the one used.
        if self._tracer is None:
            self._tracer = trace.get_tracer(TRACER_NAME)
        return self._tracer

    @contextmanager
    def crossing(self) -> Iterator[Callable[[Envelope], Envelope]]:
        """A span around one crossing; what it yields is given each event appended
        inside it (and gives it back), and names and fills the span from it."""
        with self.tracer.start_as_current_span(
            "blackbox.crossing", kind=SpanKind.CLIENT, record_exception=True
        ) as span:

            def seen(envelope: Envelope) -> Envelope:
                name, attributes = _described(envelope)
                span.update_name(name)
                span.set_attributes(attributes)
                if "error" in envelope.attributes:
                    span.set_attribute("error.type", envelope.attributes["error"])
                    span.set_status(Status(StatusCode.ERROR))
                return envelope

            yield seen


def _described(envelope: Envelope) -> tuple[str, dict[str, str | int | list[str]]]:
    """The span name and attributes of ``envelope`` (metadata only)."""
    found = envelope.attributes
    attributes: dict[str, str | int | list[str]] = {
        "blackbox.run_id": envelope.run_id,
        "blackbox.sequence": envelope.sequence,
        "blackbox.event_id": envelope.event_id,
        "blackbox.event_type": envelope.event_type,
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
