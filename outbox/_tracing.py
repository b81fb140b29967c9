"""W3C trace context of the current OpenTelemetry span, when there is one."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace


@dataclass(frozen=True, slots=True)
class TraceContext:
    """Hex trace and span ids, as the envelope carries them."""

    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None


NO_TRACE = TraceContext()


def current_trace() -> TraceContext:
    """The context of the active span; empty when tracing is off or no span is active."""
    span = trace.get_current_span()
    context = span.get_span_context()
    if not context.is_valid:
        return NO_TRACE
    # The API span has no parent; SDK spans expose it as ``parent``.
    parent = getattr(span, "parent", None)
    return TraceContext(
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
    )
