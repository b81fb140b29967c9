"""A failed crossing's span holds its error as recorded: redacted, with no stack trace.

An agent records with ``otel=True`` on the real stack (a Postgres recorder, the SDK's
in-memory exporter behind the global tracer provider). Each kind of boundary fails with
a message that carries an API key, an e-mail address and a password: a tool, an LLM
call, a retrieval and a side effect. Whatever reaches the trace backend (span names,
attributes, status descriptions, span events) never holds any of the three; the span
names the error's type and its message exactly as the recorded event holds it; there is
no stack trace unless content is on, and then it is redacted by the same rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.outbox import AgentRun, AsyncRecorder, Recorder, RunSnapshot
from agent_blackbox.schemas import PayloadPipeline, Settings
from tests._otel import EXPORTER
from tests.integration._outbox import outbox_envelopes

pytestmark = pytest.mark.integration

KEY = "sk-proj-" + "Q7r8S9t0A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
MAIL = "ada.lovelace@example.com"
PASSWORD = "correct-horse-battery-staple"
SECRETS = (KEY, MAIL, PASSWORD)


class ProviderError(RuntimeError):
    """What a client library raises, quoting what it was given."""


def _fail(*_: Any, **__: Any) -> Any:
    raise ProviderError(f"rejected key {KEY} of {MAIL} (password={PASSWORD})")


def _tool(run: AgentRun) -> None:
    run.call("lookup", _fail, "order 17")


def _llm(run: AgentRun) -> None:
    request = {"model": "m-1", "messages": [{"role": "user", "content": "hello"}]}
    run.llm(_fail, request, provider="openai", model="m-1")


def _retrieval(run: AgentRun) -> None:
    run.retrieve("policies", _fail, "refund rules", index_version="v3", top_k=2)


def _effect(run: AgentRun) -> None:
    run.effect("refund", _fail, arguments={"order": 17, "amount": 5})


KINDS: dict[str, tuple[Callable[[AgentRun], None], str]] = {
    "tool": (_tool, "tool.call"),
    "llm": (_llm, "llm.call"),
    "retrieval": (_retrieval, "retrieval"),
    "effect": (_effect, "effect.receipt"),
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def _everything_exported(spans: InMemorySpanExporter) -> list[str]:
    """Every text of every finished span a trace backend would receive."""
    found: list[str] = []
    for span in spans.get_finished_spans():
        found += [span.name, str(span.status.description or "")]
        found += [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            found.append(event.name)
            found += [str(v) for v in (event.attributes or {}).values()]
    return found


def _failed_span(spans: InMemorySpanExporter, event_type: str) -> ReadableSpan:
    [span] = [
        s
        for s in spans.get_finished_spans()
        if (s.attributes or {}).get("blackbox.event_type") == event_type
    ]
    return span


def _recorded_error(engine: Engine, run_id: str, event_type: str) -> dict[str, str]:
    """The error the event of ``event_type`` holds in the outbox (its body, opened)."""
    [event] = [e for e in outbox_envelopes(engine, run_id) if e.event_type == event_type]
    error: dict[str, str] = PayloadPipeline().unpack(event)["error"]
    return error


def _record(engine: Engine, settings: Settings, kind: str, *, content: bool) -> str:
    crossing, _ = KINDS[kind]
    recorder = Recorder(engine, settings=settings, otel=True, otel_content=content)
    run = recorder.start_run(RunSnapshot(code_version="spans.1"), agent_id="spans")
    with pytest.raises(ProviderError):
        run.drive(lambda r, _: crossing(r), None)
    return run.run_id


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_failed_crossing_s_span_holds_only_the_redacted_error(
    kind: str, engine: Engine, settings: Settings, spans: InMemorySpanExporter
) -> None:
    run_id = _record(engine, settings, kind, content=False)

    exported = _everything_exported(spans)
    assert exported
    leaked = [text for text in exported for secret in SECRETS if secret in text]
    assert leaked == []
    event_type = KINDS[kind][1]
    span = _failed_span(spans, event_type)
    recorded = _recorded_error(engine, run_id, event_type)
    assert recorded["type"] == "ProviderError"
    assert "[redacted:" in recorded["message"]
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == f"ProviderError: {recorded['message']}"
    assert (span.attributes or {})["error.type"] == "ProviderError"
    [exception] = [e for e in span.events if e.name == "exception"]
    assert dict(exception.attributes or {}) == {
        "exception.type": "ProviderError",
        "exception.message": recorded["message"],
    }  # no stack trace with content off


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_with_content_on_the_stack_trace_is_there_and_redacted(
    kind: str, engine: Engine, settings: Settings, spans: InMemorySpanExporter
) -> None:
    run_id = _record(engine, settings, kind, content=True)

    leaked = [text for text in _everything_exported(spans) for s in SECRETS if s in text]
    assert leaked == []
    event_type = KINDS[kind][1]
    [exception] = [e for e in _failed_span(spans, event_type).events if e.name == "exception"]
    stack = str((exception.attributes or {})["exception.stacktrace"])
    assert "in _fail" in stack  # the frames are there: where it failed
    recorded = _recorded_error(engine, run_id, event_type)
    assert stack.endswith(f"ProviderError: {recorded['message']}\n")


def test_the_async_recorder_s_spans_hold_only_the_redacted_error(
    engine: Engine, settings: Settings, spans: InMemorySpanExporter
) -> None:
    async def agent(run: Any, _: Any) -> None:
        await run.call("lookup", _fail, "order 17")

    async def main() -> None:
        async_engine = create_async_engine(settings.database_url)
        try:
            recorder = AsyncRecorder(async_engine, settings=settings, otel=True)
            with pytest.raises(ProviderError):
                await recorder.record(agent, RunSnapshot(code_version="spans.1"), agent_id="a")
        finally:
            await async_engine.dispose()

    asyncio.run(main())
    assert [t for t in _everything_exported(spans) for s in SECRETS if s in t] == []
    [exception] = [e for e in _failed_span(spans, "tool.call").events if e.name == "exception"]
    assert "[redacted:" in str((exception.attributes or {})["exception.message"])
