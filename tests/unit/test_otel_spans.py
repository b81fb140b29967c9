"""OpenTelemetry spans of boundary crossings (opt-in), checked with the SDK's in-memory
exporter: names and GenAI attributes, parentage, the envelope carrying the span's ids,
and no recorded content on any span."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_blackbox.outbox import AgentRun, AsyncMemoryRecorder, MemoryRecorder, RunSnapshot
from tests._otel import EXPORTER

SECRET_PROMPT = "the customer's secret question"
SECRET_RESULT = "the tool's secret answer"
REPLY = {
    "id": "c1",
    "model": "m-1",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "an answer"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def _agent(run: AgentRun, _: Any) -> str:
    found = run.call("lookup", lambda q: SECRET_RESULT, SECRET_PROMPT)
    request = {"model": "m-1", "messages": [{"role": "user", "content": SECRET_PROMPT}]}
    run.llm(lambda _r: REPLY, request, provider="openai", model="m-1")
    return str(found)


def _named(spans: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans.get_finished_spans()}


def test_each_crossing_is_a_genai_span_whose_ids_the_event_carries(
    spans: InMemorySpanExporter,
) -> None:
    recorder = MemoryRecorder(otel=True)
    tracer = trace.get_tracer("the agent")
    with tracer.start_as_current_span("handle request") as outer:
        recorder.record(_agent, RunSnapshot(code_version="c1"), agent_id="a")
    named = _named(spans)

    chat = named["chat m-1"]
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.request.model"] == "m-1"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 11
    assert chat.attributes["gen_ai.usage.output_tokens"] == 7
    assert tuple(chat.attributes["gen_ai.response.finish_reasons"]) == ("stop",)  # type: ignore[arg-type]
    tool = named["execute_tool lookup"]
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "lookup"

    [llm_event] = [e for e in recorder.events if e.event_type == "llm.call"]
    context = chat.get_span_context()
    assert llm_event.trace_id == f"{context.trace_id:032x}"
    assert llm_event.span_id == f"{context.span_id:016x}"
    assert chat.parent is not None
    assert chat.parent.span_id == outer.get_span_context().span_id
    assert llm_event.parent_span_id == f"{chat.parent.span_id:016x}"
    assert chat.attributes["blackbox.run_id"] == llm_event.run_id
    assert chat.attributes["blackbox.sequence"] == llm_event.sequence
    assert chat.attributes["blackbox.event_id"] == llm_event.event_id
    # Every crossing has its span, the run's start and end too, under the agent's span.
    assert {"blackbox run.started", "blackbox run.finished"} <= set(named)
    started = named["blackbox run.started"]
    assert recorder.events[0].span_id == f"{started.get_span_context().span_id:016x}"
    assert started.parent is not None
    assert started.parent.span_id == outer.get_span_context().span_id
    assert started.attributes is not None
    assert type(started.attributes["blackbox.event_type"]) is str


def test_no_recorded_content_is_put_on_a_span(spans: InMemorySpanExporter) -> None:
    MemoryRecorder(otel=True).record(_agent, RunSnapshot(code_version="c1"), agent_id="a")
    shown = [
        str(value)
        for span in spans.get_finished_spans()
        for value in (span.attributes or {}).values()
    ]
    assert shown
    assert not [v for v in shown if SECRET_PROMPT in v or SECRET_RESULT in v or "an answer" in v]


def test_content_goes_on_spans_only_when_asked_and_only_as_recorded(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    mail = "jo.hansen@example.com"

    def agent(run: AgentRun, _: Any) -> str:
        found = run.call("lookup", lambda q: f"{SECRET_RESULT}, mail {mail}", SECRET_PROMPT)
        messages = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"{SECRET_PROMPT}: write to {mail}"},
        ]
        run.llm(lambda _r: REPLY, {"model": "m-1", "messages": messages}, provider="openai")
        return str(found)

    monkeypatch.setenv("BLACKBOX_OTEL_CONTENT", "1")
    MemoryRecorder(otel=True).record(agent, RunSnapshot(code_version="c1"), agent_id="a")
    named = _named(spans)
    chat = dict(named["chat m-1"].attributes or {})
    tool = dict(named["execute_tool lookup"].attributes or {})
    sent = json.loads(str(chat["gen_ai.input.messages"]))
    assert sent[1]["content"] == f"{SECRET_PROMPT}: write to [redacted:email]"
    assert json.loads(str(chat["gen_ai.output.messages"]))[0]["content"] == "an answer"
    assert SECRET_PROMPT in str(tool["gen_ai.tool.call.arguments"])
    assert "[redacted:email]" in str(tool["gen_ai.tool.call.result"])
    shown = [
        str(v) for span in spans.get_finished_spans() for v in (span.attributes or {}).values()
    ]
    assert not [v for v in shown if mail in v]  # redacted as the event holds it

    spans.clear()
    MemoryRecorder(otel=True, otel_content=False).record(
        agent, RunSnapshot(code_version="c1"), agent_id="a"
    )
    shown = [
        str(v) for span in spans.get_finished_spans() for v in (span.attributes or {}).values()
    ]
    assert shown
    assert not [v for v in shown if SECRET_PROMPT in v or "an answer" in v]


def test_spans_are_off_unless_asked_for(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLACKBOX_OTEL", raising=False)
    MemoryRecorder().record(_agent, RunSnapshot(code_version="c1"), agent_id="a")
    assert spans.get_finished_spans() == ()
    monkeypatch.setenv("BLACKBOX_OTEL", "1")
    MemoryRecorder().record(_agent, RunSnapshot(code_version="c1"), agent_id="a")
    assert "chat m-1" in _named(spans)


def test_a_failed_tool_call_is_a_span_with_an_error(spans: InMemorySpanExporter) -> None:
    def failing(run: AgentRun, _: Any) -> None:
        run.call("lookup", lambda: (_ for _ in ()).throw(TimeoutError("slow")))

    with pytest.raises(TimeoutError):
        MemoryRecorder(otel=True).record(failing, RunSnapshot(code_version="c1"), agent_id="a")
    tool = _named(spans)["execute_tool lookup"]
    assert tool.status.status_code == StatusCode.ERROR
    assert tool.attributes is not None
    assert tool.attributes["error.type"] == "TimeoutError"


def test_the_async_recorder_emits_the_same_spans(spans: InMemorySpanExporter) -> None:
    async def agent(run: Any, _: Any) -> None:
        await run.call("lookup", lambda q: SECRET_RESULT, "q")

    async def main() -> None:
        await AsyncMemoryRecorder(otel=True).record(
            agent, RunSnapshot(code_version="c1"), agent_id="a"
        )

    asyncio.run(main())
    assert "execute_tool lookup" in _named(spans)
