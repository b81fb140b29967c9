"""Spans on the real stack: an agent recording into Postgres with spans on; the events
read back from Kafka carry the ids of the spans the exporter received."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from sqlalchemy import Engine

from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests._otel import EXPORTER
from tests.integration._backups import relay
from tests.integration._kafka import read_topic

pytestmark = pytest.mark.integration

REPLY = {
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def _agent(run: AgentRun, _: Any) -> None:
    run.call("lookup", lambda q: {"q": q}, "weather")
    run.llm(lambda _r: REPLY, {"model": "m", "messages": []}, provider="openai", model="m")


def test_the_published_events_carry_the_ids_of_their_spans(
    settings: Settings, engine: Engine
) -> None:
    EXPORTER.clear()
    recorder = Recorder(engine, settings=settings, otel=True)
    with trace.get_tracer("agent").start_as_current_span("request"):
        run, _ = recorder.record(_agent, RunSnapshot(code_version="otel.1"), agent_id="otel")
    relay(engine, settings)
    published = [
        e
        for _p, _o, e in read_topic(
            settings.kafka_bootstrap, settings.topic, expect=run.last_sequence
        )
    ]

    spans = {
        f"{span.get_span_context().span_id:016x}": span for span in EXPORTER.get_finished_spans()
    }
    crossings = [e for e in published if e.event_type in ("tool.call", "llm.call")]
    assert len(crossings) == 2
    for event in crossings:
        span = spans[event.span_id or ""]
        assert span.attributes is not None
        assert span.attributes["blackbox.event_id"] == event.event_id
        assert f"{span.get_span_context().trace_id:032x}" == event.trace_id
    assert {spans[e.span_id or ""].name for e in crossings} == {"execute_tool lookup", "chat m"}
