"""The LangGraph recipe (``agent_blackbox.examples.recipes.langgraph``) on the real stack.

The recipe's agent runs a tool loop on LangChain's ``ChatOpenAI`` and ``ChatAnthropic``,
which build their own SDK clients, against the local model servers. What is proved:

- with ``instrument()`` every model call of either chat model is an ``llm.call`` and every
  tool call a ``tool.call`` (``invoke``, ``ainvoke``, ``astream`` of streamed tokens);
  ``ChatOpenAI`` records on recording ``http_client=`` clients alone, too;
- the issue's acceptance: 20 runs recorded and replayed offline from Kafka 20/20 under a
  socket guard, a prompt change reported at the recipe's own line, two concurrent runs
  on one process-wide model each recording exactly their own calls;
- the issue's motivating bug is gone: without ``instrument()``, ``ChatAnthropic``'s calls
  are reported as holes of every run (not silently missing), and replay refuses them
  instead of going online, in the same process, over the client's kept connection;
- LangSmith stays off the network: tracing is off as the recipe says, LangSmith's
  endpoint is a local trap that must receive nothing, and record and replay run under
  socket guards; one test turns tracing on to show what the trap catches.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")
pytest.importorskip("langchain_anthropic")

import langsmith.utils
from langchain_anthropic import ChatAnthropic
from langchain_core.tools import tool
from langchain_core.tracers.langchain import wait_for_all_tracers
from langchain_openai import ChatOpenAI
from sqlalchemy import Engine

import agent_blackbox as bb
from agent_blackbox.examples.recipes import langgraph as recipe
from agent_blackbox.outbox import UnrecordedCallWarning
from agent_blackbox.replayer import DivergenceKind
from agent_blackbox.schemas import Settings
from tests.integration._anthropic_server import PREFACE
from tests.integration._guard import SocketGuard, port_of, service_ports
from tests.integration._llm_server import LLMServer, LoopbackServer, QuietHandler
from tests.integration.frameworks._harness import (
    RUNS,
    assert_all_passed,
    attributes_by_run,
    city_of,
    finished_attributes,
    instrumented,
    llm_calls_by_run,
    publish,
    questions,
    record_runs,
    record_runs_async,
    replay_all_offline,
    replay_from_kafka,
)
from tests.integration.frameworks._model import (
    AgentAnthropicServer,
    AgentOpenAIServer,
    MeetingServer,
)

pytestmark = [pytest.mark.integration]

ANTHROPIC_RUNS = 4
STREAMED_RUNS = 5
TRACING_VARIABLES = (
    "LANGSMITH_TRACING",
    "LANGSMITH_TRACING_V2",
    "LANGCHAIN_TRACING",
    "LANGCHAIN_TRACING_V2",
)


def _report(city: str) -> str:
    """What the recipe's tool says of ``city``."""
    return str(recipe.get_weather.invoke({"city": city}))


def _recipe_line(function: Callable[..., Any], text: str) -> int:
    """The line of the recipe's ``function`` that holds ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# LangSmith: off, and its endpoint a trap ----------------------------------------------


class _Trap(LoopbackServer):
    """A loopback HTTP server that answers anything with ``{}`` and keeps what it got."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str]] = []
        trap = self

        class Handler(QuietHandler):
            timeout = 10

            def _any(self) -> None:
                self.read_body()
                trap.received.append((self.command, self.path))
                self.send_json(200, {})

            def do_GET(self) -> None:
                self._any()

            def do_POST(self) -> None:
                self._any()

            def do_PATCH(self) -> None:
                self._any()

        super().__init__(Handler)


class _LangSmith:
    """LangSmith as this module's tests see it: tracing off, the endpoint a trap."""

    def __init__(self, env: pytest.MonkeyPatch, trap: _Trap) -> None:
        self._env = env
        self.trap = trap
        self.tracing = False

    def trace(self) -> None:
        """Turn tracing on (what the recipe says not to do)."""
        self._env.setenv("LANGSMITH_TRACING", "true")
        _forget_langsmith_settings()
        self.tracing = True


def _forget_langsmith_settings() -> None:
    # LangSmith reads its environment once and caches it: changed here, read again.
    langsmith.utils.get_env_var.cache_clear()
    langsmith.utils.get_tracer_project.cache_clear()


@pytest.fixture(autouse=True)
def langsmith_off() -> Iterator[_LangSmith]:
    """Tracing off as the recipe says, LangSmith's endpoint a trap that must receive
    nothing (unless a test turned tracing on)."""
    with _Trap() as trap, pytest.MonkeyPatch.context() as env:
        for name in TRACING_VARIABLES:
            env.delenv(name, raising=False)
        env.setenv("LANGSMITH_ENDPOINT", trap.address)
        env.setenv("LANGSMITH_API_KEY", "lsv2-test-key")
        _forget_langsmith_settings()
        seen = _LangSmith(env, trap)
        yield seen
    _forget_langsmith_settings()
    if not seen.tracing:
        assert trap.received == [], f"LangSmith was reached: {trap.received}"


# Servers, guards and views ------------------------------------------------------------


@contextmanager
def only_reaching(settings: Settings, *servers: LLMServer) -> Iterator[None]:
    """Record with nothing reachable but Postgres, Kafka and the model ``servers``: any
    other connection (LangSmith's, say) is refused and fails the test."""
    with SocketGuard(service_ports(settings) | {port_of(s.base_url) for s in servers}) as guard:
        yield
    assert guard.refused == [], f"the recording tried to connect to {guard.refused}"


@pytest.fixture
def openai_server() -> Iterator[AgentOpenAIServer]:
    with AgentOpenAIServer() as server:
        yield server


@pytest.fixture
def anthropic_server() -> Iterator[AgentAnthropicServer]:
    with AgentAnthropicServer() as server:
        yield server


def chat_openai(server: LLMServer) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-test", base_url=server.base_url, api_key="sk-test")


def chat_anthropic(server: LLMServer) -> ChatAnthropic:
    return ChatAnthropic(model="claude-test", base_url=server.base_url, api_key="sk-ant-test")


def tools_by_run(engine: Engine, run_ids: list[str]) -> dict[str, list[str | None]]:
    """The tools each run called, as the events view holds them."""
    found = attributes_by_run(engine, run_ids, "tool.call", "tool")
    return {run_id: [name for (name,) in calls] for run_id, calls in found.items()}


def model_calls_by_run(engine: Engine, run_ids: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """(provider, model, streamed) of each model call per run, as the events view holds
    them (``streamed`` is None for a call that was not)."""
    return attributes_by_run(engine, run_ids, "llm.call", "provider", "model", "streamed")


# The recipe's tools ---------------------------------------------------------------------


def test_langchain_infers_the_tool_schema_through_bb_tool() -> None:
    assert recipe.get_weather.name == "get_weather"
    assert recipe.get_weather.description == "The weather in a city right now."
    schema = recipe.get_weather.args_schema.model_json_schema()  # type: ignore[union-attr]
    assert (schema["properties"], schema["required"]) == (
        {"city": {"title": "City", "type": "string"}},
        ["city"],
    )

    def get_weather(city: str) -> str:
        """The weather in a city right now."""
        return city

    with pytest.raises(TypeError, match="not a callable object"):
        # The other order: bb.tool is handed LangChain's tool object, not a function.
        bb.tool(tool(get_weather))


# OpenAI ------------------------------------------------------------------------------------


def test_runs_on_chat_openai_are_recorded_and_replay_offline_from_kafka(
    settings: Settings, engine: Engine, openai_server: AgentOpenAIServer
) -> None:
    agent = recipe.WeatherAgent(chat_openai(openai_server))
    asked = questions(RUNS)
    with instrumented():
        with only_reaching(settings, openai_server):
            recorded = record_runs(
                settings, engine, agent.answer, asked, agent_id="langgraph-openai"
            )
        assert [output for _, output in recorded.runs.values()] == [
            f"answer: {_report(city_of(q))}" for q in asked
        ]
        assert len(openai_server.requests) == 2 * RUNS
        publish(settings, engine)
        run_ids = recorded.run_ids
        assert llm_calls_by_run(engine, run_ids) == dict.fromkeys(run_ids, 2)
        assert tools_by_run(engine, run_ids) == {r: ["get_weather"] for r in run_ids}
        calls = model_calls_by_run(engine, run_ids)
        assert calls == {r: [("openai", "gpt-test", None)] * 2 for r in run_ids}

        reports = replay_all_offline(settings, engine, recorded, agent.answer)
    assert_all_passed(reports)
    assert len(reports) == RUNS
    assert len(openai_server.requests) == 2 * RUNS  # replay sent nothing


def test_streamed_tokens_are_recorded_through_recording_http_clients_alone(
    settings: Settings, engine: Engine, openai_server: AgentOpenAIServer
) -> None:
    model = recipe.recorded_chat_openai(
        model="gpt-test", base_url=openai_server.base_url, api_key="sk-test"
    )
    agent = recipe.WeatherAgent(model)
    asked = questions(STREAMED_RUNS)
    with only_reaching(settings, openai_server):
        recorded = record_runs_async(
            settings, agent.answer_streamed, asked, agent_id="langgraph-streamed"
        )
    for question, tokens in recorded.runs.values():
        assert len(tokens) > 2  # token by token, as the model sent them
        assert "".join(tokens) == f"answer: {_report(city_of(question))}"
    assert all(r.json().get("stream") is True for r in openai_server.requests)
    publish(settings, engine)
    run_ids = recorded.run_ids
    assert model_calls_by_run(engine, run_ids) == {
        r: [("openai", "gpt-test", "true")] * 2 for r in run_ids
    }
    assert tools_by_run(engine, run_ids) == {r: ["get_weather"] for r in run_ids}

    reports = replay_all_offline(settings, engine, recorded, agent.answer_streamed)
    assert_all_passed(reports)
    assert len(openai_server.requests) == 2 * STREAMED_RUNS


def test_a_prompt_change_diverges_at_the_recipes_model_call(
    settings: Settings, engine: Engine, openai_server: AgentOpenAIServer
) -> None:
    model = chat_openai(openai_server)
    with instrumented():
        recorded = record_runs(
            settings, engine, recipe.WeatherAgent(model).answer, questions(1), agent_id="lg"
        )
        publish(settings, engine)
        changed = recipe.WeatherAgent(model, prompt=recipe.SYSTEM_PROMPT + " Be brief.")
        report = replay_from_kafka(settings, engine, recorded.run_ids[0], changed.answer)
    divergence = report.divergence
    assert divergence is not None
    assert divergence.kind is DivergenceKind.ARGUMENT_MISMATCH
    assert (divergence.sequence, divergence.expected_type) == (2, "llm.call")
    assert [c.path for c in divergence.changes] == ["request.messages[0].content"]
    site = divergence.call_site
    assert site is not None
    think = recipe.WeatherAgent._think
    assert (site.file, site.function) == (recipe.__file__, "_think")
    assert site.line == _recipe_line(think, "self._model.invoke(")


def test_two_concurrent_runs_on_one_model_each_record_their_own_calls(
    settings: Settings, engine: Engine
) -> None:
    with MeetingServer(parties=2) as server, instrumented():
        agent = recipe.WeatherAgent(chat_openai(server))  # one model for the process
        asked = questions(2)
        with only_reaching(settings, server):
            recorded = record_runs_async(
                settings, agent.answer_async, asked, agent_id="langgraph-pair", at_once=2
            )
        assert not server.meeting.broken
        outputs = {question: output for question, output in recorded.runs.values()}
        assert outputs == {q: f"answer: {_report(city_of(q))}" for q in asked}
        publish(settings, engine)
        run_ids = recorded.run_ids
        assert llm_calls_by_run(engine, run_ids) == dict.fromkeys(run_ids, 2)
        assert tools_by_run(engine, run_ids) == {r: ["get_weather"] for r in run_ids}
        # Each run's recorded requests are its own question's: replayed with its own
        # input, each run asks exactly what it recorded.
        reports = replay_all_offline(settings, engine, recorded, agent.answer_async)
    assert_all_passed(reports)
    assert len(server.requests) == 4


# Anthropic ---------------------------------------------------------------------------------


def test_every_chat_anthropic_call_is_an_llm_call_with_instrument(
    settings: Settings, engine: Engine, anthropic_server: AgentAnthropicServer
) -> None:
    agent = recipe.WeatherAgent(chat_anthropic(anthropic_server))
    asked = questions(ANTHROPIC_RUNS)
    with instrumented():
        with only_reaching(settings, anthropic_server):
            plain = record_runs(settings, engine, agent.answer, asked, agent_id="lg-claude")
            streamed = record_runs_async(
                settings, agent.answer_streamed, asked[:2], agent_id="lg-claude-stream"
            )
        assert len(anthropic_server.requests) == 2 * (ANTHROPIC_RUNS + 2)
        for question, output in plain.runs.values():
            assert output == f"echo: tool_result:{_report(city_of(question))}"
        for question, tokens in streamed.runs.values():  # both turns' text, token by token
            said = f"{PREFACE}echo: tool_result:{_report(city_of(question))}"
            assert (len(tokens) > 2, "".join(tokens)) == (True, said)
        publish(settings, engine)
        calls = model_calls_by_run(engine, plain.run_ids + streamed.run_ids)
        assert calls == {
            **{r: [("anthropic", "claude-test", None)] * 2 for r in plain.run_ids},
            **{r: [("anthropic", "claude-test", "true")] * 2 for r in streamed.run_ids},
        }
        assert set(map(tuple, tools_by_run(engine, list(calls)).values())) == {("get_weather",)}

        reports = replay_all_offline(settings, engine, plain, agent.answer)
        reports += replay_all_offline(settings, engine, streamed, agent.answer_streamed)
    assert_all_passed(reports)
    assert len(anthropic_server.requests) == 2 * (ANTHROPIC_RUNS + 2)


def test_without_instrument_chat_anthropic_calls_are_holes_and_replay_stays_offline(
    settings: Settings, engine: Engine, anthropic_server: AgentAnthropicServer
) -> None:
    agent = recipe.WeatherAgent(chat_anthropic(anthropic_server))
    with pytest.warns(UnrecordedCallWarning, match=r"POST /v1/messages"):
        recorded = record_runs(settings, engine, agent.answer, questions(3), agent_id="lg-hole")
    publish(settings, engine)
    run_ids = recorded.run_ids
    assert llm_calls_by_run(engine, run_ids) == dict.fromkeys(run_ids, 0)
    assert tools_by_run(engine, run_ids) == {r: ["get_weather"] for r in run_ids}
    line = _recipe_line(recipe.WeatherAgent._think, "self._model.invoke(")
    port = port_of(anthropic_server.base_url)
    for attributes in finished_attributes(engine, run_ids).values():
        # Every run, not only the first: the later ones send over the kept connection.
        assert attributes["unrecorded_calls"] == "2"
        hole = attributes["unrecorded_call"]
        assert hole.startswith(f"POST /v1/messages to 127.0.0.1:{port} ")
        assert f"at _think ({recipe.__file__}:{line})" in hole

    sent = len(anthropic_server.requests)
    assert sent == 6
    # In this process, on the client that holds a connection to the running server.
    reports = [replay_from_kafka(settings, engine, r, agent.answer) for r in run_ids]
    assert len(anthropic_server.requests) == sent
    for report in reports:
        assert report.divergence is not None
        assert report.divergence.kind is DivergenceKind.UNRECORDED_CALL
        assert report.divergence.call_site is not None
        assert report.divergence.call_site.line == line


# LangSmith ----------------------------------------------------------------------------------


def test_langsmith_tracing_would_send_the_run_where_the_recorder_cannot_see(
    settings: Settings,
    engine: Engine,
    openai_server: AgentOpenAIServer,
    langsmith_off: _LangSmith,
) -> None:
    langsmith_off.trace()
    agent = recipe.WeatherAgent(chat_openai(openai_server))
    with instrumented():
        recorded = record_runs(settings, engine, agent.answer, questions(1), agent_id="lg-ls")
    wait_for_all_tracers()
    posted = [path for method, path in langsmith_off.trap.received if method == "POST"]
    assert posted, "LangSmith sent nothing: the trap proves nothing"
    # From LangSmith's own thread: neither recorded nor reported as a hole.
    publish(settings, engine)
    (run_id,) = recorded.run_ids
    assert llm_calls_by_run(engine, [run_id]) == {run_id: 2}
    assert "unrecorded_calls" not in finished_attributes(engine, [run_id])[run_id]
