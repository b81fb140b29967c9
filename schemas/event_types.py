"""The names of the event types."""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    """Every boundary event type the recorder writes."""

    RUN_STARTED = "run.started"
    LLM_CALL = "llm.call"
    TOOL_CALL = "tool.call"
    CLOCK_READ = "clock.read"
    RANDOM_DRAW = "random.draw"
    RETRIEVAL = "retrieval"
    EFFECT_INTENT = "effect.intent"
    EFFECT_RECEIPT = "effect.receipt"
    STATE_TRANSITION = "state.transition"
    RUN_FINISHED = "run.finished"
    RUN_REDACTED = "run.redacted"
    """Not a boundary: appended after ``run.finished`` when the run's keys are destroyed."""
