"""What the CLI prints of agent-chosen text: a run id, an agent name or a payload that
carries terminal controls (OSC 8 links, clear-screen, bidi overrides) or emoji shortcodes
never reaches the output raw. Runs come from an archive, so no service is needed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent_blackbox.cli import main
from agent_blackbox.consumers._retention import Redaction, RetentionReport
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import safe_console
from tests._run_ids import unchecked_run_ids

LINK = "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J"
RLO = "\u202e"
SHORTCODE = ":smile:"
HOSTILE = f"{LINK}{CLEAR}{RLO}gpj.exe{SHORTCODE}"
ENTRY = "tests.unit.test_cli_display"


def _echo(text: str) -> str:
    return text


def echo_entry(run: AgentRun, input: Any) -> Any:
    return run.call("echo", _echo, input["text"])


def changed_entry(run: AgentRun, input: Any) -> Any:
    """Calls the tool with another argument: diverges, showing both payloads."""
    return run.call("echo", _echo, input["text"] + HOSTILE)


def _assert_nothing_raw(output: str) -> None:
    assert "\x1b" not in output
    assert RLO not in output
    assert "\U0001f604" not in output  # the emoji :smile: would become
    assert "\\x1b]8;;https://evil.example/" in output  # shown, escaped


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    recorder = MemoryRecorder()
    snapshot = RunSnapshot(code_version="display.1", input={"text": HOSTILE})
    with unchecked_run_ids():  # an archive of a run recorded before the run id rule
        recorder.record(echo_entry, snapshot, agent_id=f"agent{SHORTCODE}", run_id=f"run-{HOSTILE}")
    path = tmp_path_factory.mktemp("archive") / "runs.avro"
    write_archive(path, list(recorder.events))
    return str(path)


def _replay(archive: str, entry: str, *args: str) -> Result:
    env = {
        "BLACKBOX_PURPOSE": "unit test of safe display",
        "BLACKBOX_AGENTS": f"agent{SHORTCODE}={ENTRY}:{entry}",
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }
    return CliRunner(env=env).invoke(main, ["replay", "--archive", archive, *args])


def test_the_pass_line_escapes_a_hostile_run_id(archive: str) -> None:
    result = _replay(archive, "echo_entry", f"run-{HOSTILE}")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout
    _assert_nothing_raw(result.stdout + result.stderr)
    assert SHORTCODE in result.stdout  # shown as written


def test_the_diverged_line_and_values_escape_a_hostile_run_id_and_payload(archive: str) -> None:
    result = _replay(archive, "changed_entry", f"run-{HOSTILE}", "--show-values")
    assert result.exit_code == 1, result.output
    assert "DIVERGED" in result.stdout
    _assert_nothing_raw(result.stdout + result.stderr)


def test_a_batch_summary_escapes_a_hostile_run_id(archive: str) -> None:
    result = _replay(archive, "changed_entry", "--all")
    assert result.exit_code == 1, result.output
    assert "Runs that did not pass" in result.stdout
    _assert_nothing_raw(result.stdout + result.stderr)


def test_the_forget_and_retention_table_escapes_run_ids_and_reasons() -> None:
    from agent_blackbox.cli.commands.retention import _print_redactions

    report = RetentionReport(
        redacted=(Redaction(run_id=f"run-{HOSTILE}", reason=f"subject {HOSTILE}", key_ids=()),)
    )
    console = safe_console(record=True, width=400)
    _print_redactions(report, console, title="Runs")
    shown = console.export_text()
    _assert_nothing_raw(shown)
    assert SHORTCODE in shown


def test_every_console_of_the_project_is_made_by_safe_console() -> None:
    root = Path(__file__).resolve().parents[2]
    makers = [
        str(path.relative_to(root))
        for package in ("cli", "consumers", "keystore", "replayer", "schemas", "stack", "bench")
        for path in (root / package).rglob("*.py")
        if "Console(" in path.read_text(encoding="utf-8").replace("safe_console(", "")
    ]
    assert makers == ["schemas/_display.py"]


def test_a_model_clients_request_lines_are_not_logged() -> None:
    """Replay answers every model call; httpx (and SDKs on the httpx2 line) would log a
    line for each at INFO."""
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.NOTSET)
    assert CliRunner().invoke(main, ["stack", "--help"]).exit_code == 0
    for name in ("httpx", "httpx2"):
        assert logging.getLogger(name).level == logging.WARNING, name
