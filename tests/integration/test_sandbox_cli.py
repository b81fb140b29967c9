"""``blackbox replay --nondeterminism``: an agent reading the clock directly is reported
with its line, as a warning (exit 0) or as a failed run (exit 1)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import Settings

pytestmark = pytest.mark.integration

MODULE = "sbx_cli_agent"
SOURCE = """
import time


def agent(run, value):
    return {"late": time.time() > 0}
"""
LINE = 6


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(MODULE)
        recorder = MemoryRecorder()
        recorder.record(module.agent, RunSnapshot("sbx.1", {}), agent_id="sbx")
        write_archive(tmp_path / "runs.avro", recorder.events)
        yield tmp_path / "runs.avro"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(MODULE, None)


def test_replay_reports_direct_clock_reads_and_fails_on_request(
    settings: Settings, archive: Path
) -> None:
    env = {"BLACKBOX_DATABASE_URL": settings.database_url, "BLACKBOX_PURPOSE": "sandbox test"}
    arguments = ["replay", "--all", "--archive", str(archive), "--agent", f"{MODULE}:agent"]
    warned = CliRunner(env=env).invoke(main, [*arguments, "--json"])
    assert warned.exit_code == 0, warned.output
    result, summary = [json.loads(line) for line in warned.stdout.splitlines()]
    assert summary["type"] == "summary"
    assert result["result"] == "PASS"
    [found] = result["nondeterminism"]
    assert found["kind"] == "unrecorded_nondeterminism"
    assert found["what"] == "time.time"
    assert (found["call_site"]["function"], found["call_site"]["line"]) == ("agent", LINE)
    failed = CliRunner(env=env).invoke(main, [*arguments, "--json", "--nondeterminism", "fail"])
    assert failed.exit_code == 1, failed.output
    run_line, summary = [json.loads(line) for line in failed.stdout.splitlines()]
    assert run_line["result"] == "NONDETERMINISTIC"
    assert summary["nondeterministic"] == 1
    assert summary["exit_code"] == 1
    refused = CliRunner(env=env).invoke(main, [*arguments, "--nondeterminism", "loud"])
    assert refused.exit_code == 2
