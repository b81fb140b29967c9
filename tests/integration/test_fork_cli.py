"""``blackbox fork`` and ``blackbox reexecute`` against a real SDK and a local endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from openai import OpenAI
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import MemoryRecorder
from agent_blackbox.outbox.storage import pending_events_txn
from agent_blackbox.replayer import fork_diff, fork_run, read_archive, write_archive
from agent_blackbox.schemas import Settings
from tests.integration import _fork_agents, _openai_server
from tests.integration._openai_server import OpenAIServer, Reply

pytestmark = pytest.mark.integration
SECRET = "sk-test-never-recorded-0123456789"


@pytest.fixture
def triage_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    """An OpenAI-compatible endpoint answering like the agent's own stand-in model."""
    model = KeywordModel()

    def answer(path: str, request: Mapping[str, Any]) -> Reply:
        return Reply(HTTPStatus.OK, model.complete(request))

    monkeypatch.setattr(_openai_server, "answer", answer)
    with OpenAIServer() as server:
        yield server


@pytest.fixture
def parent(tmp_path: Path) -> tuple[Path, str]:
    recorder = MemoryRecorder()
    agent = TicketAgent(sample_tickets(1), KeywordModel(), Notifier())
    run, _ = recorder.record(agent.run, agent.snapshot("T-00000"), agent_id="ticket-agent")
    archive = tmp_path / "parent.avro"
    write_archive(archive, recorder.events)
    return archive, run.run_id


def test_fork_calls_the_real_endpoint_with_the_changed_model(
    triage_server: OpenAIServer, parent: tuple[Path, str]
) -> None:
    archive, run_id = parent
    arguments = [
        run_id,
        "--archive",
        str(archive),
        "--agent",
        "agent_blackbox.examples.ticket_agent:fork_entry",
        "--set",
        "model=triage-large-2",
        "--base-url",
        triage_server.base_url,
        "--effects",
        "sandbox",
        "--dry-run",
        "--purpose",
        "try a larger model",
        "--json",
    ]
    result = CliRunner(env={"OPENAI_API_KEY": SECRET}).invoke(main, ["fork", *arguments])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["parent_run_id"] == run_id
    assert summary["status"] == "succeeded"
    assert summary["sandboxed_effects"] == 1
    assert [r.json()["model"] for r in triage_server.requests] == ["triage-large-2"]
    assert triage_server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in result.output


def test_reexecute_reports_each_call(
    triage_server: OpenAIServer, parent: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, run_id = parent
    arguments = [run_id, "--archive", str(archive), "--base-url", triage_server.base_url]
    arguments += ["--purpose", "compare the model's answers today", "--json"]
    same = CliRunner().invoke(main, ["reexecute", *arguments])
    assert same.exit_code == 0, same.output
    [call] = json.loads(same.stdout)["calls"]
    assert (call["sequence"], call["same"]) == (4, True)

    def terse(path: str, request: Mapping[str, Any]) -> Reply:
        reply = KeywordModel().complete(request)
        reply["choices"][0]["finish_reason"] = "length"
        return Reply(HTTPStatus.OK, reply)

    monkeypatch.setattr(_openai_server, "answer", terse)
    differs = CliRunner().invoke(main, ["reexecute", *arguments])
    assert differs.exit_code == 1
    [call] = json.loads(differs.stdout)["calls"]
    assert call["changed"] == {"finish_reason": {"recorded": ["stop"], "now": ["length"]}}


# Tools of a fork, its diff, its replay -------------------------------------------------


@pytest.fixture
def weather_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    """The local endpoint, where the large model plans a look-up of Oslo, not Paris."""
    original = _openai_server.answer

    def answer(path: str, request: Mapping[str, Any]) -> Reply:
        reply = original(path, request)
        if request.get("model") == "weather-large" and request.get("tools"):
            call = reply.body["choices"][0]["message"]["tool_calls"][0]
            call["function"]["arguments"] = json.dumps({"city": "Oslo"})
        return reply

    monkeypatch.setattr(_openai_server, "answer", answer)
    _fork_agents.LIVE_CALLS.clear()
    with OpenAIServer() as server:
        yield server
    _fork_agents.LIVE_CALLS.clear()


def _weather_parent(server: OpenAIServer, tmp_path: Path, *, stream_usage: bool = False) -> str:
    recorder = MemoryRecorder()
    agent = _fork_agents.WeatherAgent(
        OpenAI(base_url=server.base_url, api_key="k", max_retries=0),
        _fork_agents.MODEL,
        stream_usage=stream_usage,
    )
    run, output = recorder.record(agent.run, _fork_agents.snapshot(), agent_id="weather")
    assert output["weather"] == [{"city": "Paris", "temp_c": 15}]
    write_archive(tmp_path / "weather.avro", recorder.events)
    _fork_agents.LIVE_CALLS.clear()
    return run.run_id


def _fork(server: OpenAIServer, tmp_path: Path, run_id: str, *options: str) -> Result:
    arguments = [run_id, "--archive", str(tmp_path / "weather.avro")]
    arguments += ["--agent", "tests.integration._fork_agents:fork_entry"]
    arguments += ["--base-url", server.base_url, "--dry-run", "--purpose", "try a model"]
    return CliRunner().invoke(main, ["fork", *arguments, *options])


def test_fork_with_recorded_tools_stops_at_a_tool_the_parent_never_called(
    weather_server: OpenAIServer, tmp_path: Path
) -> None:
    run_id = _weather_parent(weather_server, tmp_path)
    result = _fork(weather_server, tmp_path, run_id, "--set", "model=weather-large", "--json")
    assert result.exit_code == 2, result.output
    assert "get_weather" in result.stderr
    assert "--tools live" in result.stderr
    assert "--tools recorded-then-live" in result.stderr
    assert _fork_agents.LIVE_CALLS == []
    summary = json.loads(result.stdout)
    assert (summary["tools"], summary["status"]) == ("recorded", "failed")


def test_fork_with_live_tools_calls_them_and_shows_what_changed(
    weather_server: OpenAIServer, tmp_path: Path
) -> None:
    run_id = _weather_parent(weather_server, tmp_path)
    options = ("--set", "model=weather-large", "--tools", "live", "--json")
    result = _fork(weather_server, tmp_path, run_id, *options)
    assert result.exit_code == 0, result.output
    assert _fork_agents.LIVE_CALLS == ["Oslo"]
    diff = json.loads(result.stdout)["diff"]
    assert diff["same"] is False
    paths = [c["path"] for c in diff["output"]["changes"]]
    assert paths == ["$.answer", "$.weather[0].city", "$.weather[0].temp_c"]
    [tool] = diff["tool_calls"]
    assert tool["changed"] == ["arguments", "result"]
    assert (tool["parent"]["arguments"]["args"], tool["fork"]["arguments"]["args"]) == (
        ["Paris"],
        ["Oslo"],
    )
    assert tool["fork"]["source"] == "live"
    plan, answer = diff["llm_calls"]
    assert set(plan["changed"]) == {"model", "tool_calls"}
    assert plan["fork"]["tool_calls"] == [[{"name": "get_weather", "arguments": {"city": "Oslo"}}]]
    assert set(answer["changed"]) == {"model", "text"}


def test_fork_with_recorded_then_live_tools_answers_from_the_recording_while_it_matches(
    weather_server: OpenAIServer, tmp_path: Path
) -> None:
    run_id = _weather_parent(weather_server, tmp_path)
    same = _fork(weather_server, tmp_path, run_id, "--tools", "recorded-then-live", "--json")
    assert same.exit_code == 0, same.output
    assert _fork_agents.LIVE_CALLS == []
    assert json.loads(same.stdout)["diff"]["tool_calls"][0]["fork"]["source"] == "recorded"
    options = ("--set", "model=weather-large", "--tools", "recorded-then-live")
    moved = _fork(weather_server, tmp_path, run_id, *options)
    assert moved.exit_code == 0, moved.output
    assert _fork_agents.LIVE_CALLS == ["Oslo"]
    # Without --json the fork is printed next to its parent.
    for heading in ("Final output", "Tool calls", "LLM calls", "parent", "fork"):
        assert heading in moved.stdout
    assert "Oslo" in moved.stdout
    assert "Paris" in moved.stdout


def test_a_fork_replays_with_the_changes_it_was_recorded_with(
    weather_server: OpenAIServer, tmp_path: Path
) -> None:
    run_id = _weather_parent(weather_server, tmp_path)
    parent = list(read_archive(tmp_path / "weather.avro"))
    fork = fork_run(
        parent,
        _fork_agents.fork_entry,
        changes={"model": "weather-large"},
        base_url=weather_server.base_url,
        api_key="k",
        tools="live",
    )
    assert fork.status == "succeeded"
    write_archive(tmp_path / "fork.avro", fork.events)
    arguments = [fork.run_id, "--archive", str(tmp_path / "fork.avro"), "--purpose", "replay"]
    asked = len(weather_server.requests)
    replayed = CliRunner().invoke(
        main, ["replay", *arguments, "--agent", "tests.integration._fork_agents:replay_entry"]
    )
    assert replayed.exit_code == 0, replayed.output
    assert len(weather_server.requests) == asked  # replay called no model
    # The agent's plain entry knows nothing of the fork's model: that replay diverges.
    plain = CliRunner().invoke(
        main,
        ["replay", *arguments, "--agent", "tests.integration._fork_agents:plain_replay_entry"],
    )
    assert plain.exit_code == 1, plain.output
    # The parent still replays through the fork-aware entry.
    parent_replay = [run_id, "--archive", str(tmp_path / "weather.avro"), "--purpose", "replay"]
    again = CliRunner().invoke(
        main, ["replay", *parent_replay, "--agent", "tests.integration._fork_agents:replay_entry"]
    )
    assert again.exit_code == 0, again.output


# Re-execution of streamed calls ---------------------------------------------------------


@pytest.mark.parametrize("stream_usage", [False, True])
def test_reexecute_compares_a_streamed_call_like_with_like(
    weather_server: OpenAIServer, tmp_path: Path, stream_usage: bool
) -> None:
    run_id = _weather_parent(weather_server, tmp_path, stream_usage=stream_usage)
    arguments = [run_id, "--archive", str(tmp_path / "weather.avro"), "--base-url"]
    arguments += [weather_server.base_url, "--purpose", "model drift check", "--json"]
    recorded = len(weather_server.requests)
    result = CliRunner().invoke(main, ["reexecute", *arguments])
    assert result.exit_code == 0, result.output
    plan, answer = json.loads(result.stdout)["calls"]
    assert (plan["streamed"], plan["same"]) == (False, True)
    assert plan["fields"]["tool_calls"]["now"] == [
        [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    ]
    assert (answer["streamed"], answer["same"], answer["changed"]) == (True, True, {})
    assert answer["fields"]["usage"]["compared"] is stream_usage
    assert answer["fields"]["usage"]["now"] == {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
    }
    resent = weather_server.requests[recorded:][1].json()
    assert resent["stream"] is True
    assert resent["stream_options"] == {"include_usage": True}


def test_reexecute_json_diffs_tool_calls_by_name_and_parsed_arguments(
    weather_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _weather_parent(weather_server, tmp_path)
    original = _openai_server.answer

    def elsewhere(path: str, request: Mapping[str, Any]) -> Reply:
        reply = original(path, request)
        if request.get("tools"):
            call = reply.body["choices"][0]["message"]["tool_calls"][0]
            call["function"]["arguments"] = '{"city":  "Lyon"}'
        return reply

    monkeypatch.setattr(_openai_server, "answer", elsewhere)
    arguments = [run_id, "--archive", str(tmp_path / "weather.avro"), "--base-url"]
    arguments += [weather_server.base_url, "--purpose", "model drift check", "--json"]
    result = CliRunner().invoke(main, ["reexecute", *arguments])
    assert result.exit_code == 1, result.output
    plan, answer = json.loads(result.stdout)["calls"]
    assert plan["changed"] == {
        "tool_calls": {
            "recorded": [[{"name": "get_weather", "arguments": {"city": "Paris"}}]],
            "now": [[{"name": "get_weather", "arguments": {"city": "Lyon"}}]],
        }
    }
    assert answer["same"] is True


def test_the_example_agent_forks_with_live_tools(
    triage_server: OpenAIServer, parent: tuple[Path, str]
) -> None:
    archive, run_id = parent
    arguments = [run_id, "--archive", str(archive), "--base-url", triage_server.base_url]
    arguments += ["--agent", "agent_blackbox.examples.ticket_agent:fork_entry", "--dry-run"]
    arguments += ["--tools", "live", "--effects", "sandbox", "--purpose", "live tools", "--json"]
    result = CliRunner().invoke(main, ["fork", *arguments])
    assert result.exit_code == 0, result.output
    [ticket] = json.loads(result.stdout)["diff"]["tool_calls"]
    # Read live from the ticket system, and the same ticket the parent read.
    assert (ticket["fork"]["source"], ticket["same"]) == ("live", True)


def test_a_fork_with_live_tools_is_recorded_in_the_outbox(
    weather_server: OpenAIServer, tmp_path: Path, engine: Engine, settings: Settings
) -> None:
    _weather_parent(weather_server, tmp_path)
    parent = list(read_archive(tmp_path / "weather.avro"))
    fork = fork_run(
        parent,
        _fork_agents.fork_entry,
        changes={"model": "weather-large"},
        base_url=weather_server.base_url,
        api_key="k",
        tools="recorded-then-live",
        engine=engine,
        settings=settings,
    )
    assert (fork.status, fork.events) == ("succeeded", [])
    assert _fork_agents.LIVE_CALLS == ["Oslo"]
    with engine.connect() as conn:
        # run.started, the two LLM calls, the tool call, run.finished
        assert pending_events_txn(conn, [fork.run_id]) == 5
    diff = fork_diff(parent, fork)
    assert [c.path for c in diff.output_changes] == [
        "$.answer",
        "$.weather[0].city",
        "$.weather[0].temp_c",
    ]


# Forks of async agents, recorded in the outbox -------------------------------------------


def _async_fork(server: OpenAIServer, tmp_path: Path, settings: Settings, *options: str) -> Result:
    run_id = _weather_parent(server, tmp_path)
    arguments = [run_id, "--archive", str(tmp_path / "weather.avro"), "--base-url"]
    arguments += [server.base_url, "--agent", "tests.integration._fork_agents:async_fork_entry"]
    arguments += ["--purpose", "fork an async agent", "--json", *options]
    env = {"BLACKBOX_DATABASE_URL": settings.database_url, "BLACKBOX_KEK_FILE": None}
    return CliRunner(env={**env, "BLACKBOX_KEK": None}).invoke(main, ["fork", *arguments])


def _status(engine: Engine, run_id: str) -> str:
    with engine.connect() as conn:
        query = text("SELECT status FROM blackbox.runs WHERE run_id = :r")
        return str(conn.execute(query, {"r": run_id}).scalar_one())


def test_a_fork_of_an_async_agent_is_awaited_and_ends_succeeded(
    weather_server: OpenAIServer, tmp_path: Path, engine: Engine, settings: Settings
) -> None:
    result = _async_fork(weather_server, tmp_path, settings)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["status"], summary["recorded"]) == ("succeeded", "outbox")
    assert summary["diff"]["same"] is True  # the same calls as the plain agent's, awaited
    assert _status(engine, summary["run_id"]) == "succeeded"
    with engine.connect() as conn:
        # run.started, the two LLM calls, the tool call, run.finished
        assert pending_events_txn(conn, [summary["run_id"]]) == 5


def test_a_fork_of_an_async_agent_that_raises_ends_failed(
    weather_server: OpenAIServer, tmp_path: Path, engine: Engine, settings: Settings
) -> None:
    result = _async_fork(weather_server, tmp_path, settings, "--set", "flag.outage=yes")
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "failed"
    assert summary["error"] == "WeatherOutage: the weather service is down"
    assert _status(engine, summary["run_id"]) == "failed"


def _interrupted(run: Any, input: Any) -> Any:
    raise KeyboardInterrupt


async def _interrupted_async(run: Any, input: Any) -> Any:
    raise KeyboardInterrupt


@pytest.mark.parametrize("agent", [_interrupted, _interrupted_async], ids=["plain", "async"])
def test_an_interrupted_fork_ends_failed_and_the_interruption_goes_on(
    weather_server: OpenAIServer, tmp_path: Path, engine: Engine, settings: Settings, agent: Any
) -> None:
    _weather_parent(weather_server, tmp_path)
    parent = list(read_archive(tmp_path / "weather.avro"))
    with pytest.raises(KeyboardInterrupt):
        fork_run(
            parent,
            lambda snapshot, **_: agent,
            changes={},
            base_url=weather_server.base_url,
            api_key="k",
            engine=engine,
            settings=settings,
        )
    with engine.connect() as conn:
        statuses = conn.execute(text("SELECT status FROM blackbox.runs")).scalars().all()
    assert statuses == ["failed"]
