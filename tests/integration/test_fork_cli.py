"""``blackbox fork`` and ``blackbox reexecute`` against a real SDK and a local endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.examples.ticket_agent import KeywordModel, Notifier, TicketAgent, sample_tickets
from agent_blackbox.outbox import MemoryRecorder
from agent_blackbox.replayer import write_archive
from tests.integration import _openai_server
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
