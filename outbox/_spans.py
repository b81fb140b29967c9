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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.schemas import Envelope, EventType, completion_view, env_flag

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
    def crossing(self) -> Iterator[Callable[[Envelope, Crossing], Envelope]]:
        """A span around one crossing; what it yields is given each event appended
        inside it with its crossing (and gives the event back), and names and fills the
        span from them."""
        with self.tracer.start_as_current_span(
            "blackbox.crossing", kind=SpanKind.CLIENT, record_exception=True
        ) as span:

            def seen(envelope: Envelope, crossing: Crossing) -> Envelope:
                name, attributes = _described(envelope)
                span.update_name(name)
                span.set_attributes(attributes)
                if self.content:
                    span.set_attributes(_content(envelope.event_type, crossing))
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
