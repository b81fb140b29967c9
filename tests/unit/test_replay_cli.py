"""``blackbox replay`` as CI sees it: exit statuses, messages, skipped agents, zero
matches, forks, ``--purpose`` checks, and the JSON-lines stream checked against its
documentation. Runs come from an archive, so no service is needed."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent_blackbox.cli import main
from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    TicketAgent,
    replay_entry,
    sample_tickets,
)
from agent_blackbox.keystore import purpose_problem
from agent_blackbox.outbox import AgentRun, MemoryRecorder
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import Envelope, Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "replay-json.md"
TICKET_ENTRY = "agent_blackbox.examples.ticket_agent:replay_entry"
BROKEN_MODULE = "blackbox_test_agent_that_fails_to_import"
EXITING_MODULE = "blackbox_test_agent_that_exits_on_import"


def mutant_entry(run: AgentRun, input: Any) -> Any:
    """The ticket agent with a changed tool argument: diverges at sequence 2."""
    return replay_entry(run, {"ticket_id": input["ticket_id"].lower()})


_CALLS: list[str] = []


def interrupting_entry(run: AgentRun, input: Any) -> Any:
    """Replays the first run it is given; Ctrl-C arrives during the second."""
    _CALLS.append(run.run_id)
    if len(_CALLS) > 1:
        raise KeyboardInterrupt
    return replay_entry(run, input)


# -- the recorded runs --------------------------------------------------------------


def _record(recorder: MemoryRecorder, ticket: str, agent_id: str, **snapshot: Any) -> str:
    agent = TicketAgent(sample_tickets(10), KeywordModel(), Notifier())
    run, _ = recorder.record(
        agent.run, replace(agent.snapshot(ticket), **snapshot), agent_id=agent_id
    )
    return run.run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An archive with one run of each fate, in this order."""
    recorder = MemoryRecorder()
    ids = {
        "pass": _record(recorder, "T-00001", "ticket-agent"),
        "diverge": _record(recorder, "T-00002", "mutant-agent"),
        "skip": _record(recorder, "T-00003", "stranger-agent"),
        "error": _record(recorder, "T-00004", "broken-agent"),
        "fork": _record(
            recorder, "T-00005", "ticket-agent", parent_run_id="parent-1", changes={"model": "x"}
        ),
    }
    out_of_line = MemoryRecorder(settings=Settings(blob_threshold_bytes=200))
    ids["blob"] = _record(out_of_line, "T-00006", "blob-agent")
    assert out_of_line.blobs  # the archive will not carry them: a setup problem
    path = tmp_path_factory.mktemp("archive") / "runs.avro"
    events: list[Envelope] = [*recorder.events, *out_of_line.events]
    write_archive(path, events)
    return {"path": str(path), **ids}


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runs: dict[str, Any]) -> Any:
    (tmp_path / f"{BROKEN_MODULE}.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / f"{EXITING_MODULE}.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {
        "BLACKBOX_PURPOSE": "unit test of the replay command",
        "BLACKBOX_AGENTS": ",".join(
            [
                f"ticket-agent={TICKET_ENTRY}",
                f"blob-agent={TICKET_ENTRY}",
                "mutant-agent=tests.unit.test_replay_cli:mutant_entry",
                f"broken-agent={BROKEN_MODULE}:entry",
            ]
        ),
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }

    def invoke(*args: str, **extra_env: str | None) -> Result:
        runner = CliRunner(env={**env, **extra_env})
        return runner.invoke(main, ["replay", *args, "--archive", runs["path"]])

    return invoke


def _lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


# -- the documented JSON shape ------------------------------------------------------

_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
    "null": type(None),
}


def _documented() -> dict[str, dict[str, list[str]]]:
    """Section title → field → allowed types, read from the doc's tables."""
    shapes: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
            shapes[section] = {}
        elif row := re.match(r"^\| `(\w+)` \| ([^|]+) \|", line):
            shapes[section][row[1]] = [t.strip() for t in row[2].split(" or ")]
    return shapes


def _conforms(value: Any, types: list[str]) -> bool:
    for name in types:
        if name.startswith('"') or name.startswith('`"'):
            if value == name.strip('`"'):
                return True
        elif isinstance(value, _TYPES[name]) and not (
            isinstance(value, bool) and name in ("integer", "number")
        ):
            return True
    return False


def _check(obj: dict[str, Any], shape: dict[str, list[str]], *, exact: bool) -> None:
    assert shape, "the documented table is empty"
    missing = set(shape) - set(obj)
    assert not missing, f"documented fields missing: {missing}"
    if exact:
        assert set(obj) == set(shape), f"undocumented fields: {set(obj) - set(shape)}"
    for name, types in shape.items():
        assert _conforms(obj[name], types), f"{name}={obj[name]!r} is not {types}"


def _validate(lines: list[dict[str, Any]]) -> None:
    shapes = _documented()
    assert lines
    assert lines[-1]["type"] == "summary"
    assert all(line["type"] == "run" for line in lines[:-1])
    for line in lines[:-1]:
        _check(line, shapes["The `run` line"], exact=True)
        for divergence in line["divergences"]:
            # The divergence object may gain fields (the doc says readers ignore them).
            _check(divergence, shapes["The divergence object"], exact=False)
    _check(lines[-1], shapes["The `summary` line"], exact=True)
    assert lines[-1]["runs"] == len(lines) - 1


def test_the_doc_describes_every_line_type() -> None:
    assert {"The `run` line", "The divergence object", "The `summary` line"} <= set(_documented())


def test_a_mixed_batch_reports_every_run_and_exits_1_for_the_divergence(
    cli: Any, runs: dict[str, Any]
) -> None:
    result = cli("--all", "--json")
    lines = _lines(result)
    _validate(lines)
    results = {line["run_id"]: line["result"] for line in lines[:-1]}
    assert results == {
        runs["pass"]: "PASS",
        runs["diverge"]: "DIVERGED",
        runs["skip"]: "SKIPPED",
        runs["error"]: "ERROR",
        runs["blob"]: "ERROR",
    }  # the fork is left out
    summary = lines[-1]
    assert summary["failing_run_ids"] == [runs["diverge"], runs["error"], runs["blob"]]
    assert summary["skipped_run_ids"] == [runs["skip"]]
    assert (summary["passed"], summary["diverged"], summary["errors"]) == (1, 1, 2)
    assert summary["divergence_kinds"] == {"argument_mismatch": 1}
    assert summary["exit_code"] == result.exit_code == 1


def test_errors_carry_the_exception_and_the_run_id(cli: Any, runs: dict[str, Any]) -> None:
    lines = {line["run_id"]: line for line in _lines(cli("--all", "--json"))[:-1]}
    broken = lines[runs["error"]]
    assert broken["error"].startswith("UnknownAgent: cannot import")
    assert "RuntimeError: boom at import" in broken["error"]
    assert broken["levels"] == dict.fromkeys(("control_flow", "state", "content"), "unchecked")
    assert broken["divergence"] is None
    blob = lines[runs["blob"]]
    assert blob["error"].startswith("ReplaySetupError:")
    assert runs["blob"] in blob["error"]
    assert "blob reader" in blob["error"]
    skipped = lines[runs["skip"]]
    assert "no entry point for agent 'stranger-agent'" in skipped["skipped"]


def test_the_text_summary_lists_the_runs_that_did_not_pass(cli: Any, runs: dict[str, Any]) -> None:
    result = cli("--all")
    assert result.exit_code == 1
    assert "1/5 runs passed" in result.stdout
    for key in ("diverge", "error", "blob", "skip"):
        assert runs[key][:8] in result.stdout


def test_only_errors_and_skips_exit_2(cli: Any) -> None:
    assert cli("--all", "--agent-id", "stranger-agent").exit_code == 2
    broken = cli("--all", "--agent-id", "broken-agent", "--json")
    assert broken.exit_code == 2
    assert _lines(broken)[-1]["errors"] == 1


def test_all_passed_exits_0_and_forks_join_only_when_asked(cli: Any, runs: dict[str, Any]) -> None:
    alone = cli("--all", "--agent-id", "ticket-agent", "--json")
    assert alone.exit_code == 0
    assert [line["run_id"] for line in _lines(alone)[:-1]] == [runs["pass"]]
    assert _lines(alone)[-1]["filters"] == "finished runs of agent 'ticket-agent', forks excluded"
    both = cli("--all", "--agent-id", "ticket-agent", "--include-forks", "--json")
    assert both.exit_code == 0
    assert [line["run_id"] for line in _lines(both)[:-1]] == [runs["pass"], runs["fork"]]


def test_nothing_matched_exits_2_and_says_what_was_filtered(cli: Any) -> None:
    result = cli("--all", "--agent-id", "nobody")
    assert result.exit_code == 2
    assert "nothing matched" in result.stderr
    assert "of agent 'nobody'" in result.stderr
    assert "--include-forks" in result.stderr
    as_json = cli("--all", "--since", "2999-01-01", "--json")
    assert as_json.exit_code == 2
    [summary] = _lines(as_json)
    _validate([summary])
    assert summary["runs"] == 0
    assert summary["exit_code"] == 2
    assert "nothing matched" in summary["error"]
    assert "since 2999-01-01" in summary["error"]


def test_since_takes_a_span_as_export_does(cli: Any, runs: dict[str, Any]) -> None:
    recent = cli("--all", "--agent-id", "ticket-agent", "--since", "1w", "--json")
    assert recent.exit_code == 0, recent.stderr
    assert [line["run_id"] for line in _lines(recent)[:-1]] == [runs["pass"]]
    wrong = cli("--all", "--since", "last tuesday")
    assert wrong.exit_code == 2
    assert "span back from now (30m, 1h, 2d, 1w) or an ISO time" in " ".join(wrong.stderr.split())


def test_single_run_json_is_the_same_stream(cli: Any, runs: dict[str, Any]) -> None:
    result = cli(runs["diverge"], "--json")
    lines = _lines(result)
    _validate(lines)
    assert [line["result"] for line in lines[:-1]] == ["DIVERGED"]
    assert lines[-1]["filters"] is None
    assert result.exit_code == lines[-1]["exit_code"] == 1
    passed = cli(runs["pass"])
    assert passed.exit_code == 0
    assert "PASS" in passed.stdout


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("no_such_module_anywhere:entry", "ModuleNotFoundError: No module named"),
        (f"{BROKEN_MODULE}:entry", "RuntimeError: boom at import"),
        (f"{EXITING_MODULE}:entry", "SystemExit: 3"),
        ("agent_blackbox.examples.ticket_agent:no_such_function", "has no 'no_such_function'"),
        ("agent_blackbox.examples.ticket_agent:CODE_VERSION", "not a function"),
        ("just-a-name", "give module:function"),
        ("./agents/my_agent.py:entry", "give my_agent:entry from the folder 'agents'"),
    ],
)
def test_a_wrong_entry_point_exits_2_with_the_reason(
    cli: Any, runs: dict[str, Any], agent: str, message: str
) -> None:
    result = cli(runs["pass"], "--agent", agent)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "DIVERGED" not in result.output


def test_a_single_run_without_entry_point_is_an_error_not_a_skip(
    cli: Any, runs: dict[str, Any]
) -> None:
    result = cli(runs["skip"], "--json")
    assert result.exit_code == 2
    assert _lines(result)[0]["result"] == "ERROR"
    assert "MissingEntryPoint: no entry point for agent 'stranger-agent'" in result.stdout


def test_setup_problems_of_one_run_exit_2_with_the_message(cli: Any, runs: dict[str, Any]) -> None:
    blob = cli(runs["blob"])
    assert blob.exit_code == 2
    assert f"ERROR run {runs['blob']}" in blob.stderr
    assert "ReplaySetupError" in blob.stderr
    missing = cli("no-such-run")
    assert missing.exit_code == 2
    assert "run no-such-run is not in archive" in missing.stderr


def test_an_interrupted_batch_still_ends_with_its_summary(cli: Any, runs: dict[str, Any]) -> None:
    _CALLS.clear()
    entry = "tests.unit.test_replay_cli:interrupting_entry"
    args = ("--all", "--agent-id", "ticket-agent", "--include-forks", "--agent", entry, "--json")
    result = cli(*args, BLACKBOX_AGENTS=None)
    lines = _lines(result)
    _validate(lines)
    assert [line["run_id"] for line in lines[:-1]] == [runs["pass"]]
    assert lines[-1]["error"] == "interrupted after 1 runs; the summary covers those"
    assert result.exit_code == lines[-1]["exit_code"] == 2


def test_filters_need_all(cli: Any, runs: dict[str, Any]) -> None:
    result = cli(runs["pass"], "--include-forks")
    assert result.exit_code == 2
    assert "need --all" in result.stderr


# -- --purpose ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("purpose", "message"),
    [
        ("", "the purpose is empty"),
        ("  ", "the purpose is empty"),
        ("ab", "too short (2 characters, at least 3)"),
        ("incident\n4411", "control character (U+000A at character 9)"),
        ("check \x1b[31m", "control character (U+001B at character 7)"),
        ("fix \u202eevil", "control character (U+202E at character 5)"),
        ("x" * 501, "too long (501 characters, at most 500)"),
    ],
)
def test_a_refused_purpose_says_what_is_wrong(purpose: str, message: str) -> None:
    problem = purpose_problem(purpose)
    assert problem is not None
    assert message in problem


def test_a_plain_purpose_is_accepted() -> None:
    assert purpose_problem("incident 4411: refund loop (Zoë)") is None


def test_the_command_refuses_a_bad_purpose_before_reading_anything(
    cli: Any, runs: dict[str, Any]
) -> None:
    result = cli(runs["pass"], "--purpose", "ab")
    assert result.exit_code == 2
    assert "too short" in result.stderr
    from_env = cli(runs["pass"], BLACKBOX_PURPOSE="line one\nline two")
    assert from_env.exit_code == 2
    assert "control character" in from_env.stderr


# -- found by a new user's trial ------------------------------------------------------


class EntryClass:
    def __init__(self, tools: Any) -> None:
        self.tools = tools


def one_argument_entry(request: Any) -> Any:
    return request


@pytest.mark.parametrize(
    ("attribute", "why"),
    [("EntryClass", "is a class"), ("one_argument_entry", "cannot be called as entry")],
)
def test_an_entry_point_of_the_wrong_shape_is_an_error_not_a_divergence(
    cli: Any, runs: dict[str, Any], attribute: str, why: str
) -> None:
    result = cli(runs["pass"], "--agent", f"tests.unit.test_replay_cli:{attribute}")
    assert result.exit_code == 2, result.output
    assert why in result.stderr
    assert "DIVERGED" not in result.output


def test_a_wrong_entry_given_to_replay_run_is_the_reports_error(runs: dict[str, Any]) -> None:
    from agent_blackbox.replayer import read_archive, replay_run

    events = list(read_archive(Path(runs["path"]), run_id=runs["pass"]))
    report = replay_run(events, one_argument_entry)
    assert report.result == "ERROR"
    assert report.error is not None
    assert "cannot be called as entry(run, input)" in report.error


def test_agent_names_bind_entry_points_to_their_agents(cli: Any, runs: dict[str, Any]) -> None:
    # A plain --agent serves every agent without an entry; NAME= binds one agent only.
    named = cli("--all", "--json", "--agent", f"stranger-agent={TICKET_ENTRY}")
    lines = {line["run_id"]: line for line in _lines(named)[:-1]}
    assert lines[runs["skip"]]["result"] == "PASS"  # stranger-agent has an entry now
    two_defaults = cli("--all", "--agent", TICKET_ENTRY, "--agent", TICKET_ENTRY)
    assert two_defaults.exit_code == 2
    assert "name the others' agents" in two_defaults.stderr
    other = "tests.unit.test_replay_cli:not_an_agent"
    one_name_twice = cli("--all", "--agent", f"x={TICKET_ENTRY}", "--agent", f"x={other}")
    assert one_name_twice.exit_code == 2
    assert f"names agent x twice ({TICKET_ENTRY}, {other})" in one_name_twice.stderr


# -- runs that failed when recorded ----------------------------------------------------

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v1.avro"


def _golden(*args: str) -> Result:
    env = {"BLACKBOX_PURPOSE": "unit test of recorded failures", "BLACKBOX_KEK_FILE": None}
    arguments = ["replay", *args, "--archive", str(GOLDEN), "--agent", TICKET_ENTRY]
    return CliRunner(env={**env, "BLACKBOX_KEK": None}).invoke(main, arguments)


def test_a_run_that_failed_when_recorded_passes_and_the_report_says_so() -> None:
    result = _golden("--all", "--json")
    assert result.exit_code == 0, result.output
    lines = _lines(result)
    _validate(lines)
    ended = [(line["recorded_status"], line["recorded_error"]) for line in lines[:-1]]
    assert sorted(ended, key=str) == [("failed", "KeyError"), *[("succeeded", None)] * 5]
    assert {line["result"] for line in lines[:-1]} == {"PASS"}
    summary = lines[-1]
    assert (summary["passed"], summary["recorded_failed"]) == (6, 1)
    assert summary["passed_recorded_failed"] == 1
    text = _golden("--all")
    assert "6/6 runs passed" in text.stdout
    assert "1 of the recorded runs had failed; 1 of them passed" in text.stdout
    [failed] = [line["run_id"] for line in lines[:-1] if line["recorded_status"] == "failed"]
    single = _golden(failed)
    assert "PASS" in single.stdout
    assert "recorded run failed (KeyError)" in single.stdout
