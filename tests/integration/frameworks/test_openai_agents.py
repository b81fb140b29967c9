"""The OpenAI Agents SDK recipe (``agent_blackbox.examples.recipes.openai_agents``),
tested against the real SDK on the real stack.

Both models the SDK offers (``OpenAIChatCompletionsModel``, ``OpenAIResponsesModel``),
``Runner.run`` and ``Runner.run_streamed``, a ``function_tool`` stacked over
``agent_blackbox.tool``, and the SDK's tracing off or routed in the process: recorded on
Postgres against the local model server, published to Kafka, replayed offline from the
topic under a socket guard.
"""

from __future__ import annotations

import asyncio
import json
import linecache
import re
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from typing import Any

import pytest

# Skipped as a whole without the SDK, which the imports below need.
pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) is not installed")

import httpx2
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunContextWrapper,
    Runner,
    flush_traces,
    function_tool,
    set_trace_processors,
    set_tracing_disabled,
    set_tracing_export_api_key,
)
from agents.models import _openai_shared
from agents.tracing import Span, Trace, TracingProcessor
from agents.tracing.processors import default_exporter, default_processor
from openai import AsyncOpenAI
from sqlalchemy import Engine

import agent_blackbox as bb
from agent_blackbox.examples.recipes import openai_agents as recipe
from agent_blackbox.outbox import AsyncMemoryRecorder, RunSnapshot
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import PayloadPipeline, Settings
from tests.integration._llm_server import LLMServer, Reply
from tests.integration._openai_server import TOOL_ARGUMENTS
from tests.integration._wait import eventually
from tests.integration.frameworks._harness import (
    RUNS,
    Entry,
    Recorded,
    assert_all_passed,
    assert_recorded_whole,
    bodies_of,
    city_of,
    publish,
    questions,
    record_runs_async,
    replay_all_offline,
    replay_from_kafka,
)
from tests.integration.frameworks._model import AgentOpenAIServer, MeetingServer, tool_result_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

API_KEY = "sk-test-agents-3b1f9c7e5a2d"
AGENT_ID = "weather-desk"


def is_answer_to(question: str, output: Any) -> bool:
    """Whether ``output`` is the model's answer quoting the tool's weather of the city."""
    pattern = rf"answer: {city_of(question)}: \d+ degrees and clear"
    return isinstance(output, str) and re.fullmatch(pattern, output) is not None


# The model server and its client ------------------------------------------------------


class WeatherModelServer(AgentOpenAIServer):
    """The agent server, whose Responses function calls also take the city from the
    question (the base server's always ask for Paris), so that every run's tool call is
    its own on both APIs."""

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        reply = super().reply(path, request)
        city = asked_city(request)
        if path != "/v1/responses" or city is None or tool_result_of(request) is not None:
            return reply
        before = json.dumps(TOOL_ARGUMENTS)[1:-1]
        after = json.dumps(json.dumps({"city": city}))[1:-1]
        if reply.events is not None:
            events = tuple((name, data.replace(before, after)) for name, data in reply.events)
            return Reply(reply.status, events=events)
        return Reply(reply.status, json.loads(json.dumps(reply.body).replace(before, after)))


class WeatherMeetingServer(MeetingServer, WeatherModelServer):
    """The weather server, holding each run's first model call until the other run's
    has arrived too: the two runs are provably in flight at once."""


def asked_city(request: Mapping[str, Any]) -> str | None:
    """The city the request's question names (``city=...``), in either API's shape."""
    items = request.get("messages") or request.get("input") or []
    for item in items if isinstance(items, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str) and "city=" in content:
            return content.rsplit("city=", 1)[1].split()[0]
    return None


@pytest.fixture
def server() -> Iterator[WeatherModelServer]:
    with WeatherModelServer() as running:
        yield running


ClientOf = Callable[[str], AsyncOpenAI]


@pytest.fixture
def model_client() -> Iterator[ClientOf]:
    """Makes clients of a local server, closed after the test. Each recording and replay
    runs an event loop of its own, so a client keeps no connection past its request (one
    pooled in a closed loop cannot be used from the next)."""
    made: list[AsyncOpenAI] = []

    def client_of(base_url: str) -> AsyncOpenAI:
        http = httpx2.AsyncClient(limits=httpx2.Limits(max_keepalive_connections=0))
        made.append(
            AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, http_client=http)
        )
        return made[-1]

    yield client_of
    for client in made:
        asyncio.run(client.close())


@pytest.fixture
def sdk_defaults() -> Iterator[None]:
    """The SDK's process-wide settings a test changes, as they were before it: no
    default client, tracing on, exported by the default processor, whose exporter keeps
    its endpoint and key."""
    exporter = default_exporter()
    endpoint, key = exporter.endpoint, exporter.api_key
    yield
    _openai_shared.set_default_openai_client(None)
    set_tracing_disabled(False)
    set_trace_processors([default_processor()])
    exporter.endpoint, exporter.api_key = endpoint, key


@pytest.fixture
def wired(sdk_defaults: None) -> Iterator[Callable[[AsyncOpenAI], None]]:
    """The recipe's process-wide wiring (``use_client``), undone after the test."""
    yield recipe.use_client
    bb.uninstrument()


# Reading back -------------------------------------------------------------------------


def assert_answered_whole(engine: Engine, recorded: Recorded) -> None:
    """Every run answered its question, with two model calls and one tool call in the
    views, and no call that went out unrecorded."""
    assert_recorded_whole(engine, recorded, answered=is_answer_to, llm_calls=2, tool_calls=1)


# The acceptance -----------------------------------------------------------------------


def test_twenty_runs_on_both_models_record_and_replay_offline(
    settings: Settings,
    engine: Engine,
    server: WeatherModelServer,
    wired: Callable[[AsyncOpenAI], None],
    model_client: ClientOf,
) -> None:
    """Chat Completions and Responses, each run plain and streamed: a quarter of the
    runs each, recorded through the process-wide wiring, replayed 20/20 offline."""
    client = model_client(server.base_url)
    wired(client)
    chat = recipe.WeatherDesk(OpenAIChatCompletionsModel(recipe.MODEL, openai_client=client))
    by_name = recipe.WeatherDesk()  # the default client, on the Responses API
    assert isinstance(by_name.agent.model, str)
    groups = [chat.answer, chat.answer_streamed, by_name.answer, by_name.answer_streamed]
    share = RUNS // len(groups)
    recorded: list[tuple[Entry, Recorded]] = []
    for number, entry in enumerate(groups):
        inputs = questions(share, start=number * share)
        recorded.append((entry, record_runs_async(settings, entry, inputs, agent_id=AGENT_ID)))
    server.stop()
    sent = [(r.path, r.json().get("stream", False)) for r in server.requests]
    assert sent == [
        *[("/v1/chat/completions", False)] * 2 * share,
        *[("/v1/chat/completions", True)] * 2 * share,
        *[("/v1/responses", False)] * 2 * share,
        *[("/v1/responses", True)] * 2 * share,
    ]
    publish(settings, engine)
    for _, runs in recorded:
        assert_answered_whole(engine, runs)

    reports = [
        r for entry, runs in recorded for r in replay_all_offline(settings, engine, runs, entry)
    ]
    assert_all_passed(reports)
    assert len(reports) == share * len(groups) == RUNS
    assert len(server.requests) == 2 * RUNS  # replay sent nothing


def test_a_changed_prompt_diverges_at_the_recipes_own_line(
    settings: Settings,
    engine: Engine,
    server: WeatherModelServer,
    model_client: ClientOf,
    sdk_defaults: None,
) -> None:
    """Both models on a client of their own (``bb.capture_openai``, nothing patched),
    run plain and streamed: each run replays as recorded, and with other instructions
    as an ``argument_mismatch`` on the first model call, at the recipe's line that ran
    the agent (through the SDK's frame), naming what changed in the request."""
    set_tracing_disabled(True)
    client = bb.capture_openai(model_client(server.base_url))
    models = {
        "request.messages[0].content": OpenAIChatCompletionsModel(recipe.MODEL, client),
        "request.instructions": OpenAIResponsesModel(recipe.MODEL, client),
    }
    cases: list[tuple[str, Any, str, str]] = []
    for changed_path, model in models.items():
        for method in ("answer", "answer_streamed"):
            entry = getattr(recipe.WeatherDesk(model), method)
            recorded = record_runs_async(settings, entry, questions(1), agent_id=AGENT_ID)
            cases.append((recorded.run_ids[0], model, method, changed_path))
    server.stop()
    publish(settings, engine)

    for run_id, model, method, changed_path in cases:
        same = replay_from_kafka(
            settings, engine, run_id, getattr(recipe.WeatherDesk(model), method)
        )
        assert same.passed, same.divergence
        other = recipe.WeatherDesk(model, instructions="Answer in French, in one word.")
        report = replay_from_kafka(settings, engine, run_id, getattr(other, method))
        divergence = report.divergence
        assert divergence is not None
        assert (divergence.kind, divergence.sequence) == ("argument_mismatch", 2)
        assert [change.path for change in divergence.changes] == [changed_path]
        site = divergence.call_site
        assert site is not None
        assert (site.file, site.function) == (recipe.__file__, method)
        assert "Runner.run" in linecache.getline(site.file, site.line)
        assert site.library is not None
        assert "/agents/" in site.library.file
    assert len(server.requests) == 2 * len(cases)


@pytest.mark.parametrize("method", ["answer", "answer_streamed"])
def test_two_runs_at_once_through_one_process_wide_client_record_their_own_calls(
    settings: Settings,
    engine: Engine,
    wired: Callable[[AsyncOpenAI], None],
    model_client: ClientOf,
    method: str,
) -> None:
    """Two runs in one process, in flight together (the server holds each first call
    until both arrived) through the SDK's one default client: each run holds exactly its
    own two model calls and tool call, every request carrying its own question."""
    with WeatherMeetingServer() as server:
        wired(model_client(server.base_url))
        entry = getattr(recipe.WeatherDesk(), method)
        recorded = record_runs_async(settings, entry, questions(2), agent_id=AGENT_ID, at_once=2)
    assert not server.meeting.broken
    publish(settings, engine)
    assert_answered_whole(engine, recorded)

    for run_id, (question, _) in recorded.runs.items():
        city = city_of(question)
        llm_calls = bodies_of(settings, engine, run_id, "llm.call")
        requests = [json.loads(body["raw_request_json"]) for body in llm_calls]
        assert [asked_city(request) for request in requests] == [city, city]
        (tool_call,) = bodies_of(settings, engine, run_id, "tool.call")
        assert json.loads(tool_call["arguments_json"])["kwargs"] == {"city": city}
        assert is_answer_to(question, f"answer: {json.loads(tool_call['result_json'])}")


def test_function_tool_goes_over_bb_tool_not_under_it() -> None:
    """``function_tool`` reads the signature and docstring through ``bb.tool``'s wrapper;
    the other way round, ``bb.tool`` is handed the SDK's ``FunctionTool``, which is no
    function, and says so at once."""
    schema = recipe.get_weather.params_json_schema
    assert schema["properties"]["city"]["type"] == "string"
    assert recipe.get_weather.description == "The weather in a city now."
    with pytest.raises(TypeError, match="not a callable"):
        bb.tool(function_tool(_plain_weather))


def _plain_weather(city: str) -> str:
    """The weather."""
    return city


@function_tool
@bb.tool
def weather_in_units(ctx: RunContextWrapper[dict[str, str]], city: str) -> str:
    """The weather in a city, in the units the run's context asks for."""
    return f"{city}: 12 degrees {ctx.context['units']}"


def test_a_tools_context_argument_is_not_recorded(
    server: WeatherModelServer, model_client: ClientOf, sdk_defaults: None
) -> None:
    """A tool that takes the SDK's run context gets it (a ``ToolContext``); its
    ``tool.call`` records the model's arguments only, and replays from them."""
    set_tracing_disabled(True)
    client = bb.capture_openai(model_client(server.base_url))
    model = OpenAIChatCompletionsModel(recipe.MODEL, client)
    agent = Agent(name="weather desk", model=model, tools=[weather_in_units])

    async def entry(run: Any, question: str) -> Any:
        result = await Runner.run(agent, question, context={"units": "Celsius"})
        return result.final_output

    recorder = AsyncMemoryRecorder()
    snapshot = RunSnapshot(code_version="weather-desk/1", input=questions(1)[0])
    _, output = asyncio.run(recorder.record(entry, snapshot, agent_id=AGENT_ID))
    assert output == "answer: Oslo: 12 degrees Celsius"
    pipeline = PayloadPipeline()
    (tool_call,) = [pipeline.unpack(e) for e in recorder.events if e.event_type == "tool.call"]
    assert json.loads(tool_call["arguments_json"])["kwargs"] == {"city": "Oslo"}
    assert replay_run(recorder.events, entry).passed


# The SDK's tracing --------------------------------------------------------------------


class SpanCollector(TracingProcessor):
    """A trace processor that keeps the SDK's spans in the process."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def on_span_end(self, span: Span[Any]) -> None:
        self.kinds.append(span.span_data.type)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


class IngestServer(LLMServer):
    """Stands in for the tracing platform: takes whatever the SDK's exporter posts."""

    name = "trace-ingest-test-server"

    def reply(self, path: str, request: Mapping[str, Any]) -> Reply:
        return Reply(HTTPStatus.OK, {})


def test_tracing_routed_to_a_processor_of_its_own_records_and_replays_offline(
    settings: Settings,
    engine: Engine,
    server: WeatherModelServer,
    wired: Callable[[AsyncOpenAI], None],
    model_client: ClientOf,
) -> None:
    """Tracing on, its spans routed to the application's own processor instead of the
    platform: the runs record whole and replay offline, the spans stay in the process
    (the replay traces the same work again)."""
    wired(model_client(server.base_url))
    spans = SpanCollector()
    set_tracing_disabled(False)
    set_trace_processors([spans])
    desk = recipe.WeatherDesk()
    recorded = record_runs_async(settings, desk.answer, questions(2), agent_id=AGENT_ID)
    server.stop()
    publish(settings, engine)
    assert_answered_whole(engine, recorded)
    assert {"agent", "response", "function"} <= set(spans.kinds)
    traced = len(spans.kinds)
    reports = replay_all_offline(settings, engine, recorded, desk.answer)
    assert_all_passed(reports)
    assert len(spans.kinds) == 2 * traced


def test_the_sdks_own_exporter_sends_from_outside_the_run_so_the_recipe_turns_it_off(
    settings: Settings,
    engine: Engine,
    server: WeatherModelServer,
    wired: Callable[[AsyncOpenAI], None],
    model_client: ClientOf,
) -> None:
    """The SDK's default exporter posts its spans (the run's data among them: a tool's
    arguments and result) from a thread of its own where no run is in force, so the run
    reports no hole while its data left the process. With the recipe's wiring nothing is
    posted."""
    exporter = default_exporter()
    desk = recipe.WeatherDesk()
    with IngestServer() as ingest:
        exporter.endpoint = f"{ingest.base_url}/v1/traces/ingest"
        set_tracing_export_api_key(API_KEY)
        wired(model_client(server.base_url))
        off = record_runs_async(settings, desk.answer, questions(1), agent_id=AGENT_ID)
        flush_traces()
        assert ingest.requests == []
        set_tracing_disabled(False)  # the SDK's default
        on = record_runs_async(settings, desk.answer, questions(1, start=1), agent_id=AGENT_ID)
        flush_traces()
        # The function span carries the tool's result (the exporter's thread may be the
        # one posting it, a moment after the flush returned).
        ((_, answer),) = on.runs.values()
        tool_result = json.dumps(answer.removeprefix("answer: ")).encode()
        eventually(
            lambda: tool_result in b"".join(request.body for request in ingest.requests),
            timeout=10,
            what="the run's tool result posted to the tracing platform",
        )
    publish(settings, engine)
    assert_answered_whole(engine, off)
    assert_answered_whole(engine, on)  # and yet no unrecorded call is reported
