"""``blackbox export`` on the real stack: an OpenAI SDK agent recorded encrypted (against
the local OpenAI-compatible server), relayed to Kafka and indexed by the views consumer,
then exported through the run index as the roles the README gives: a reader for the
metadata, the replayer (with the key-encryption key) for bodies and the chat dataset,
each body read leaving its rows in the access audit."""

from __future__ import annotations

import base64
import json
from typing import Any

import openai
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import shred_run_txn
from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._backups import KEK, PROVIDER, relay
from tests.integration._fork_agents import WEATHER_TOOL
from tests.integration._openai_server import OpenAIServer
from tests.integration._views import build_views

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PURPOSE = "ticket 5120: evaluation dataset for the weather agent"
SYSTEM = "You answer questions about the weather."
QUESTION = "How is the weather in Paris? Mail it to jo.hansen@example.com"
PLACEHOLDER = "[redacted:email]"


def _weather(city: str) -> str:
    return f"sunny in {city}"


def weather_agent(sdk: openai.OpenAI, run: AgentRun, question: str) -> str:
    """A tool loop through the real SDK: the model asks for the tool, the agent calls it
    and sends the result back (without tools, so the model answers)."""
    llm = capture_openai(sdk, run)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    asked = llm.chat.completions.create(model="gpt-test", messages=messages, tools=[WEATHER_TOOL])
    turn = asked.choices[0].message
    [call] = turn.tool_calls or []
    result = run.call("get_weather", _weather, **json.loads(call.function.arguments))
    messages += [turn, {"role": "tool", "tool_call_id": call.id, "content": result}]
    answer = llm.chat.completions.create(model="gpt-test", messages=messages)
    return answer.choices[0].message.content or ""


@pytest.fixture
def recorded(engine: Engine, settings: Settings) -> tuple[str, int]:
    """One encrypted run of the agent, published and indexed: its id and event count."""
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    with (
        OpenAIServer() as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as sdk,
    ):
        snapshot = RunSnapshot(code_version="export.1", input={"question": QUESTION})
        run, _ = recorder.record(
            lambda r, input: weather_agent(sdk, r, input["question"]),
            snapshot,
            agent_id="weather",
        )
    relay(engine, settings)
    build_views(settings, engine, expect=run.last_sequence)
    return run.run_id, run.last_sequence


def _export(settings: Settings, login: Engine, *args: str, kek: bool = True) -> Result:
    env = {
        "BLACKBOX_DATABASE_URL": login.url.render_as_string(hide_password=False),
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_KEK": f"v1:{base64.b64encode(KEK).decode()}" if kek else None,
        "BLACKBOX_KEK_FILE": None,
        "BLACKBOX_PURPOSE": None,
        "COLUMNS": "400",
    }
    return CliRunner(env=env).invoke(main, ["export", *args])


def _lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def _audit(engine: Engine, run_id: str) -> list[tuple[str, str, bool]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT purpose, outcome, key_id IS NOT NULL FROM blackbox.access_audit "
                "WHERE run_id = :run ORDER BY id"
            ),
            {"run": run_id},
        ).all()
    return [tuple(row) for row in rows]  # type: ignore[misc]


def test_a_reader_exports_the_envelopes_without_a_body_or_an_audit_row(
    engine: Engine, settings: Settings, login: Login, recorded: tuple[str, int]
) -> None:
    run_id, events = recorded
    result = _export(settings, login("blackbox_reader", tenant="*"), run_id)
    lines = _lines(result)
    assert [line["sequence"] for line in lines] == list(range(1, events + 1))
    assert [line["event_type"] for line in lines] == [
        "run.started",
        "llm.call",
        "tool.call",
        "llm.call",
        "run.finished",
    ]
    assert all("body" not in line and line["key_id"] for line in lines)
    assert lines[1]["attributes"]["tool_calls_requested"] == "1"
    for secret in ("Paris", "jo.hansen", PLACEHOLDER, SYSTEM, "sunny"):
        assert secret not in result.stdout
    assert _audit(engine, run_id) == []  # metadata reads no body


def test_the_replayer_exports_the_bodies_with_a_purpose_and_the_audit_keeps_it(
    engine: Engine, settings: Settings, login: Login, recorded: tuple[str, int]
) -> None:
    run_id, events = recorded
    result = _export(
        settings, login("blackbox_replayer", tenant="*"), run_id, "--bodies", "--purpose", PURPOSE
    )
    lines = _lines(result)
    assert len(lines) == events
    assert all(isinstance(line["body"], dict) for line in lines)
    request = json.loads(lines[1]["body"]["raw_request_json"])
    assert request["messages"][1]["content"] == QUESTION.replace(
        "jo.hansen@example.com", PLACEHOLDER
    )
    assert "with their bodies" in result.stderr
    # One access request for the run, then the unwrap of its data key, both with the
    # purpose given.
    assert _audit(engine, run_id) == [(PURPOSE, "requested", False), (PURPOSE, "granted", True)]


def test_plaintext_runs_export_their_bodies_without_a_key_and_are_audited(
    engine: Engine, settings: Settings, login: Login
) -> None:
    recorder = Recorder(engine, settings=settings)  # no data keys: bodies in plaintext
    run, _ = recorder.record(
        lambda r, _input: r.call("lookup", lambda q: {"found": q}, "plain"),
        RunSnapshot(code_version="export.plain"),
        agent_id="plain",
    )
    relay(engine, settings)
    build_views(settings, engine, expect=run.last_sequence)

    replayer = login("blackbox_replayer", tenant="*")
    result = _export(settings, replayer, run.run_id, "--bodies", "--purpose", PURPOSE, kek=False)
    lines = _lines(result)
    assert json.loads(lines[1]["body"]["result_json"]) == {"found": "plain"}
    assert _audit(engine, run.run_id) == [(PURPOSE, "requested", False)]


def test_bodies_need_the_replayer_role(
    engine: Engine, settings: Settings, login: Login, recorded: tuple[str, int]
) -> None:
    run_id, _ = recorded
    reader = login("blackbox_reader", tenant="*")
    result = _export(settings, reader, run_id, "--bodies", "--purpose", PURPOSE)
    assert result.exit_code == 2, result.output
    assert "the database refused `blackbox export`" in result.stderr
    assert "blackbox_replayer login" in result.stderr
    assert not result.stdout
    assert _audit(engine, run_id) == []


def test_the_recorded_conversation_becomes_one_openai_chat_example(
    engine: Engine, settings: Settings, login: Login, recorded: tuple[str, int]
) -> None:
    run_id, _ = recorded
    replayer = login("blackbox_replayer", tenant="*")
    args = ("--format", "openai-chat", "--bodies", "--purpose", PURPOSE)
    [example] = _lines(_export(settings, replayer, run_id, *args))
    messages = example["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[1]["content"] == QUESTION.replace("jo.hansen@example.com", PLACEHOLDER)
    [call] = messages[2]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": f"sunny in {json.loads(call['function']['arguments'])['city']}",
    }
    assert messages[4]["content"].startswith("echo: ")  # the local server's answer
    assert "tool_calls" not in messages[4]
    assert example["tools"] == [WEATHER_TOOL]
    metadata = example["metadata"]
    assert (metadata["run_id"], metadata["sequences"], metadata["model"]) == (
        run_id,
        [2, 4],
        "gpt-test",
    )
    assert (metadata["provider"], metadata["api"]) == ("openai", "chat.completions")
    per_call = _lines(_export(settings, replayer, run_id, *args, "--examples", "call"))
    assert [len(e["messages"]) for e in per_call] == [3, 5]


def test_since_selects_the_indexed_runs(
    settings: Settings, login: Login, recorded: tuple[str, int]
) -> None:
    run_id, events = recorded
    reader = login("blackbox_reader", tenant="*")
    lines = _lines(_export(settings, reader, "--since", "1h", "--agent", "weather"))
    assert {line["run_id"] for line in lines} == {run_id}
    assert len(lines) == events
    nothing = _export(settings, reader, "--since", "1h", "--agent", "someone-else")
    assert nothing.exit_code == 2, nothing.output
    assert "nothing matched in the run index" in nothing.stderr


def test_bodies_forgotten_on_purpose_are_written_as_null_and_are_no_finding(
    engine: Engine, settings: Settings, login: Login, recorded: tuple[str, int]
) -> None:
    run_id, events = recorded
    with engine.begin() as conn:  # retention shreds the run: its data key is destroyed
        assert shred_run_txn(conn, run_id, reason="retention", settings=settings) is not None
    result = _export(
        settings, login("blackbox_replayer", tenant="*"), run_id, "--bodies", "--purpose", PURPOSE
    )
    lines = _lines(result)  # exit 0: a body forgotten on purpose is no refusal
    assert len(lines) == events
    assert all(line["body"] is None for line in lines)
    assert all(line["body_unavailable"].startswith("KeyDestroyed") for line in lines)
    assert f"{events} bodies forgotten (data key destroyed" in result.stderr
    assert "could not be opened" not in result.stderr
