"""The pydantic-ai recipe (``agent_blackbox.examples.recipes.pydantic_ai_agent``),
tested against the real package on the real stack.

The OpenAI models (``OpenAIChatModel``, ``OpenAIResponsesModel``) and ``AnthropicModel``
(which pydantic-ai drives through the SDK's ``client.beta.messages``), ``agent.run``,
``agent.run_stream`` and structured output (``output_type=Forecast``), the tools
``@agent.tool`` (taking a ``RunContext``) and ``@agent.tool_plain`` stacked over
``agent_blackbox.tool``; wired per provider (``http_client=bb.async_http_client()``) or
for the whole process (``bb.instrument()`` and a model named by a string). Recorded on
Postgres against local model servers that work through the tool loop, published to
Kafka, replayed offline from the topic under a socket guard.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# Skipped as a whole without pydantic-ai, which the imports below need.
pytest.importorskip("pydantic_ai", reason="pydantic-ai (pydantic-ai-slim) is not installed")

from anthropic.resources.beta.messages.messages import AsyncMessages as BetaMessages
from anthropic.resources.messages.messages import AsyncMessages as Messages
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.models.instrumented import InstrumentationSettings
from sqlalchemy import Engine

from agent_blackbox.examples.recipes import pydantic_ai_agent as recipe
from agent_blackbox.schemas import Settings
from tests.integration.frameworks._harness import (
    RUNS,
    Entry,
    Recorded,
    assert_all_passed,
    assert_recorded_whole,
    bodies_of,
    city_of,
    events_of,
    instrumented,
    publish,
    questions,
    record_runs_async,
    replay_all_offline,
    replay_from_kafka,
)
from tests.integration.frameworks._model import MeetingServer
from tests.integration.frameworks._tool_loop import (
    LoopAnthropicServer,
    LoopOpenAIServer,
    first_user_text,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

API_KEY = "sk-test-pydantic-ai-5e81d2"
AGENT_ID = "travel-desk"
ASK = "What should I pack?"
MODEL_CALLS = 3
"""Model calls per run: one per tool (two), then the answer."""
TOOL_CALLS = 2


def expected_output(method: str, question: str) -> Any:
    """What ``TravelDesk.<method>`` answers: the last tool's result, as text or data."""
    city = city_of(question)
    last = f"09:{len(city):02d} in {city}"
    return {"city": city, "summary": last} if method == "forecast" else f"answer: {last}"


# The model servers ----------------------------------------------------------------------


@pytest.fixture
def openai_server() -> Iterator[LoopOpenAIServer]:
    with LoopOpenAIServer() as running:
        yield running


@pytest.fixture
def anthropic_server() -> Iterator[LoopAnthropicServer]:
    with LoopAnthropicServer() as running:
        yield running


class LoopMeetingServer(MeetingServer, LoopOpenAIServer):
    """The tool loop's server, holding each run's first model call until the other
    run's has arrived too: the two runs are provably in flight at once."""


ModelFactory = Callable[[], Model]


def openai_models(base_url: str) -> dict[str, ModelFactory]:
    """The OpenAI models as the recipe wires them, a new one per recording: a client
    handed to a provider belongs to the event loop it first ran in (pydantic-ai replaces
    only the clients it made), and each recording runs a loop of its own."""
    return {
        "chat": lambda: recipe.openai_chat_model(base_url, API_KEY),
        "responses": lambda: recipe.openai_responses_model(base_url, API_KEY),
    }


def anthropic_models(base_url: str) -> dict[str, ModelFactory]:
    return {"anthropic": lambda: recipe.anthropic_model(base_url, API_KEY)}


# Reading back -------------------------------------------------------------------------


def assert_answered_whole(engine: Engine, recorded: Recorded, method: str) -> None:
    """Every run answered its question as ``TravelDesk.<method>`` does, with its model
    and tool calls in the views, and nothing left the process unrecorded."""

    def answered(question: str, output: Any) -> bool:
        return bool(output == expected_output(method, question))

    assert_recorded_whole(
        engine, recorded, answered=answered, llm_calls=MODEL_CALLS, tool_calls=TOOL_CALLS
    )


def shares(total: int, parts: int) -> list[int]:
    """``total`` cut in ``parts`` as even as can be."""
    return [total // parts + (i < total % parts) for i in range(parts)]


Group = tuple[str, str, ModelFactory]
"""A model's name, a desk method and the model's factory."""


def record_groups(
    settings: Settings, groups: list[Group], count: int
) -> list[tuple[Entry, str, Recorded]]:
    """``count`` runs, shared out over the groups, each group on a new desk."""
    recorded: list[tuple[Entry, str, Recorded]] = []
    start = 0
    for (_, method, make), share in zip(groups, shares(count, len(groups)), strict=True):
        entry = getattr(recipe.TravelDesk(make()), method)
        inputs = questions(share, start=start, ask=ASK)
        recorded.append(
            (entry, method, record_runs_async(settings, entry, inputs, agent_id=AGENT_ID))
        )
        start += share
    return recorded


def assert_published_whole_and_replayed(
    settings: Settings, engine: Engine, recorded: list[tuple[Entry, str, Recorded]], *, runs: int
) -> None:
    """Publish the groups' runs: each is whole in the views (``assert_answered_whole``),
    and all ``runs`` of them replay offline and pass."""
    publish(settings, engine)
    for _, method, group in recorded:
        assert_answered_whole(engine, group, method)
    reports = [
        report
        for entry, _, group in recorded
        for report in replay_all_offline(settings, engine, group, entry)
    ]
    assert len(reports) == runs
    assert_all_passed(reports)


# The acceptance -----------------------------------------------------------------------


def test_twenty_runs_on_the_openai_models_record_and_replay_offline(
    settings: Settings, engine: Engine, openai_server: LoopOpenAIServer
) -> None:
    """Chat Completions and Responses, each through ``run``, ``run_stream`` and
    structured output, wired with ``http_client=bb.async_http_client()``: 20 runs, three
    model calls and two tool calls each in the views, replayed 20/20 offline."""
    made = openai_models(openai_server.base_url)
    methods = ("answer", "answer_streamed", "forecast")
    groups = [(model, method, made[model]) for model in made for method in methods]
    recorded = record_groups(settings, groups, RUNS)
    openai_server.stop()
    paths = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
    expected_sent = [
        (paths[model], method == "answer_streamed")
        for (model, method, _), (_, _, runs) in zip(groups, recorded, strict=True)
        for _ in range(len(runs.runs) * MODEL_CALLS)
    ]
    sent = [(r.path, r.json().get("stream", False)) for r in openai_server.requests]
    assert sent == expected_sent
    assert_published_whole_and_replayed(settings, engine, recorded, runs=RUNS)


def test_anthropic_runs_go_through_beta_messages_and_replay_offline(
    settings: Settings,
    engine: Engine,
    anthropic_server: LoopAnthropicServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``AnthropicModel`` sends every request through ``client.beta.messages``, streamed
    (``agent.run``'s too): recorded, with ``bb.instrument()`` in force as well
    (a call is recorded once, whichever transports it crosses), and replayed offline."""
    sent_by: list[str] = []
    for name, cls in (("beta.messages", BetaMessages), ("messages", Messages)):
        original = cls.create

        async def create(
            self: Any, *args: Any, _name: str = name, _to: Any = original, **kw: Any
        ) -> Any:
            sent_by.append(_name)
            return await _to(self, *args, **kw)

        monkeypatch.setattr(cls, "create", create)
    (made,) = anthropic_models(anthropic_server.base_url).values()
    groups = [("anthropic", method, made) for method in ("answer", "answer_streamed", "forecast")]
    with instrumented():
        recorded = record_groups(settings, groups, 6)
    anthropic_server.stop()
    # The SDK refuses a non-streamed request for the model's whole max_tokens before
    # sending it; pydantic-ai then asks beta.messages again, streamed.
    assert set(sent_by) == {"beta.messages"}
    sent = [(r.path, r.json().get("stream")) for r in anthropic_server.requests]
    assert sent == [("/v1/messages", True)] * 6 * MODEL_CALLS
    assert_published_whole_and_replayed(settings, engine, recorded, runs=6)


def _agent_line(method: str) -> int:
    """The line of ``TravelDesk.<method>`` that runs the agent."""
    lines, start = inspect.getsourcelines(getattr(recipe.TravelDesk, method))
    return start + next(i for i, line in enumerate(lines) if "self.agent.run" in line)


@pytest.mark.parametrize(
    ("model", "method", "changed"),
    [
        ("chat", "answer", "request.messages[0].content"),
        ("responses", "answer_streamed", "request.instructions"),
        ("anthropic", "forecast", "request.system[0].text"),
    ],
)
def test_a_changed_system_prompt_diverges_at_the_recipes_own_line(
    settings: Settings,
    engine: Engine,
    openai_server: LoopOpenAIServer,
    anthropic_server: LoopAnthropicServer,
    model: str,
    method: str,
    changed: str,
) -> None:
    """A run replays as recorded on the same desk, and with other instructions as an
    ``argument_mismatch`` on the first model call, naming what changed in the request
    and the recipe's line that ran the agent (pydantic-ai sends the request from a task
    of its own; its frame comes second)."""
    made = {**openai_models(openai_server.base_url), **anthropic_models(anthropic_server.base_url)}
    desk = recipe.TravelDesk(made[model]())
    recorded = record_runs_async(
        settings, getattr(desk, method), questions(1, ask=ASK), agent_id=AGENT_ID
    )
    publish(settings, engine)
    (run_id,) = recorded.run_ids

    same = replay_from_kafka(settings, engine, run_id, getattr(desk, method))
    assert same.passed, same.divergence
    other = recipe.TravelDesk(made[model](), instructions="Answer in French.")
    report = replay_from_kafka(settings, engine, run_id, getattr(other, method))
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.kind, divergence.sequence) == ("argument_mismatch", 2)
    assert [change.path for change in divergence.changes] == [changed]
    site = divergence.call_site
    assert site is not None
    assert (site.file, site.function, site.line) == (recipe.__file__, method, _agent_line(method))
    assert site.library is not None
    assert "/site-packages/" in site.library.file


@pytest.fixture
def process_wide() -> Iterator[None]:
    """``bb.instrument()`` for the whole test, recording and replay alike (an application
    calls it once, at start-up)."""
    with instrumented():
        yield


@pytest.mark.parametrize("method", ["answer", "answer_streamed"])
@pytest.mark.usefixtures("process_wide")
def test_two_runs_at_once_on_one_shared_agent_record_their_own_calls(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """The process-wide wiring (``bb.instrument()``, the model named by a string and
    found through the environment; ``openai:`` is the Responses API): one desk, two runs
    in flight together (the server holds each first call until both arrived); each run
    holds exactly its own calls, every request carrying its own question, each tool its
    own city and no ``RunContext``; both replay offline."""
    with LoopMeetingServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        desk = recipe.TravelDesk(f"openai:{recipe.OPENAI_MODEL}")
        entry = getattr(desk, method)
        recorded = record_runs_async(
            settings, entry, questions(2, ask=ASK), agent_id=AGENT_ID, at_once=2
        )
    assert not server.meeting.broken
    publish(settings, engine)
    assert_answered_whole(engine, recorded, method)

    for run_id, (question, _) in recorded.runs.items():
        city = city_of(question)
        requests = [
            json.loads(body["raw_request_json"])
            for body in bodies_of(settings, engine, run_id, "llm.call")
        ]
        assert [first_user_text(r) for r in requests] == [question] * MODEL_CALLS
        tools = [
            json.loads(b["arguments_json"])
            for b in bodies_of(settings, engine, run_id, "tool.call")
        ]
        assert tools == [
            {"args": [], "kwargs": {"city": city}, "tool": "weather"},
            {"args": [], "kwargs": {"city": city}, "tool": "local_time"},
        ]
    reports = replay_all_offline(settings, engine, recorded, entry)
    assert_all_passed(reports)


def test_pydantic_ais_own_tracing_stays_in_the_process(
    settings: Settings, engine: Engine, openai_server: LoopOpenAIServer
) -> None:
    """pydantic-ai's OpenTelemetry instrumentation (what ``logfire.instrument_pydantic_ai``
    turns on), exporting inside the process: no connection is a hole while recording or
    tried in replay, and each recorded event carries pydantic-ai's span of its step (a
    model call its ``chat`` span, a tool call its ``execute_tool`` span), all in the
    trace of its agent run."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    Agent.instrument_all(InstrumentationSettings(tracer_provider=tracer_provider))
    try:
        entry = recipe.TravelDesk(openai_models(openai_server.base_url)["chat"]()).answer
        recorded = record_runs_async(settings, entry, questions(2, ask=ASK), agent_id=AGENT_ID)
        spans = exporter.get_finished_spans()
        openai_server.stop()
        publish(settings, engine)
        assert_answered_whole(engine, recorded, "answer")
        reports = replay_all_offline(settings, engine, recorded, entry)
    finally:
        Agent.instrument_all(False)
    assert_all_passed(reports)
    assert len(exporter.get_finished_spans()) == 2 * len(spans)  # replay traced alike

    runs = [s for s in spans if s.name.startswith("invoke_agent")]
    assert len(runs) == 2
    for run_id in recorded.run_ids:
        steps = [
            *events_of(settings, engine, run_id, "llm.call"),
            *events_of(settings, engine, run_id, "tool.call"),
        ]
        (trace,) = {event.trace_id for event in steps}
        assert trace in {format(run.context.trace_id, "032x") for run in runs}
        names = {format(s.context.span_id, "016x"): s.name for s in spans}
        assert sorted(names[str(event.span_id)] for event in steps) == sorted(
            [f"chat {recipe.OPENAI_MODEL}"] * MODEL_CALLS
            + ["execute_tool local_time", "execute_tool weather"]
        )
