"""An agent recorded as a script (``python agent.py``) names its classes ``__main__.X``;
replayed by module, they are found in the entry's module, and the reverse: an agent
recorded by module replays in its own script. Nothing is imported because a recording
names it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.outbox import MemoryRecorder, RecordedError, RunSnapshot, rebuild_error
from agent_blackbox.replayer import read_archive, replay_run, write_archive

AGENT = "blackbox_script_agent"
AGENT_SOURCE = """
import sys
from dataclasses import dataclass
from pathlib import Path

from agent_blackbox.outbox import MemoryRecorder, RecordedError, RunSnapshot, rebuild_error
from agent_blackbox.replayer import read_archive, replay_run, write_archive


class Declined(Exception):
    pass


@dataclass(frozen=True)
class Charge:
    amount: int


def charge(amount):
    if amount > 3:
        raise Declined(amount)
    return Charge(amount)


def entry(run, input):
    if input["amount"] > 9:
        raise Declined("over the limit")
    try:
        charged = run.call("charge", charge, input["amount"])
    except Declined as exc:
        return {"declined": exc.args[0]}
    return {"charged": charged.amount}


if __name__ == "__main__":
    mode, path, amount = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    if mode == "record":
        recorder = MemoryRecorder()
        try:
            recorder.record(entry, RunSnapshot("agent/1", {"amount": amount}), agent_id="agent")
        except Declined:
            pass  # recorded as the run's failure
        write_archive(path, recorder.events)
    else:
        print(replay_run(read_archive(path), entry).result)
"""


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / f"{AGENT}.py"
    path.write_text(AGENT_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop(AGENT, None)


def _run_script(script: Path, *arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _agent() -> ModuleType:
    return importlib.import_module(AGENT)


@pytest.mark.parametrize("amount", [5, 2, 10], ids=["caught", "returned", "failed"])
def test_a_script_recording_replays_by_module(script: Path, tmp_path: Path, amount: int) -> None:
    archive = tmp_path / "run.avro"
    _run_script(script, "record", str(archive), str(amount))
    events = list(read_archive(archive))
    report = replay_run(events, _agent().entry)
    assert report.passed, report.divergence and report.divergence.describe()
    # The same through the command, naming the entry by module.
    arguments = [events[0].run_id, "--archive", str(archive), "--agent", f"{AGENT}:entry"]
    replayed = CliRunner().invoke(main, ["replay", *arguments, "--purpose", "script replay"])
    assert replayed.exit_code == 0, replayed.output


def test_a_module_recording_replays_in_its_script(script: Path, tmp_path: Path) -> None:
    recorder = MemoryRecorder()
    recorder.record(_agent().entry, RunSnapshot("agent/1", {"amount": 5}), agent_id="agent")
    write_archive(tmp_path / "run.avro", recorder.events)
    assert _run_script(script, "replay", str(tmp_path / "run.avro"), "0").strip() == "PASS"


def test_a_stand_in_module_is_never_imported() -> None:
    info = {"type": "Declined", "message": "5", "module": "__main__", "args_json": "[5]"}
    rebuilt = rebuild_error(info, aliases={"__main__": "blackbox_never_imported"})
    assert isinstance(rebuilt, RecordedError)
    assert "blackbox_never_imported" not in sys.modules
