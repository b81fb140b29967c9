"""A divergence names the agent's own line, also when an installed library (a framework,
an SDK) crossed the boundary on the agent's behalf, and keeps the library's innermost
frame as a second line: in the divergence, its JSON form and ``blackbox replay``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import CallSite, Divergence, DivergenceKind, replay_run, write_archive
from agent_blackbox.schemas import Envelope
from tests.unit._installed import installed, marked_line

FRAMEWORK = "blackbox_fake_framework"
FRAMEWORK_SOURCE = """
def look_up(run, city):
    return run.call("weather", _weather, city)  # mark:crosses


def refuse(city):
    raise LookupError(city)  # mark:raises


def _weather(city):
    return {"city": city}
"""


@pytest.fixture
def framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake framework, installed in a site-packages folder as a distribution is."""
    yield from installed(FRAMEWORK, FRAMEWORK_SOURCE, tmp_path=tmp_path, monkeypatch=monkeypatch)


def paris_entry(run: AgentRun, input: Any) -> Any:
    return sys.modules[FRAMEWORK].look_up(run, "Paris")


def oslo_entry(run: AgentRun, input: Any) -> Any:
    return sys.modules[FRAMEWORK].look_up(run, "Oslo")  # mark:agent


def refusing_entry(run: AgentRun, input: Any) -> Any:
    sys.modules[FRAMEWORK].look_up(run, "Paris")
    return sys.modules[FRAMEWORK].refuse("Paris")  # mark:refused


def _recorded() -> list[Envelope]:
    recorder = MemoryRecorder()
    recorder.record(paris_entry, RunSnapshot("weather/1", {}), agent_id="weather")
    return recorder.events


def _divergence(entry: Any) -> Divergence:
    report = replay_run(_recorded(), entry)
    assert report.divergence is not None
    return report.divergence


def test_a_call_a_library_made_names_the_agents_line_and_the_librarys(
    framework: ModuleType,
) -> None:
    divergence = _divergence(oslo_entry)
    assert divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    agent_line = marked_line(Path(__file__).read_text(), "agent")
    assert divergence.call_site == CallSite(
        "oslo_entry",
        __file__,
        agent_line,
        CallSite("look_up", str(framework.__file__), marked_line(FRAMEWORK_SOURCE, "crosses")),
    )
    described = divergence.describe()
    assert f"at oslo_entry ({__file__}:{agent_line}) through look_up (" in described
    site = divergence.to_dict()["call_site"]
    assert (site["line"], site["library"]["function"]) == (agent_line, "look_up")


def test_an_error_raised_in_a_library_names_the_agents_line_and_the_librarys(
    framework: ModuleType,
) -> None:
    divergence = _divergence(refusing_entry)  # it ended failed: the run had succeeded
    assert divergence.expected_type == "run.finished"
    assert divergence.call_site is not None
    assert (divergence.call_site.function, divergence.call_site.line) == (
        "refusing_entry",
        marked_line(Path(__file__).read_text(), "refused"),
    )
    library = divergence.call_site.library
    assert library is not None
    assert (library.function, library.line) == ("refuse", marked_line(FRAMEWORK_SOURCE, "raises"))


def test_the_replay_command_shows_the_library_frame_after_the_call_site(
    framework: ModuleType, tmp_path: Path
) -> None:
    events = _recorded()
    write_archive(tmp_path / "runs.avro", events)
    arguments = [events[0].run_id, "--archive", str(tmp_path / "runs.avro")]
    arguments += ["--agent", f"{__name__}:oslo_entry", "--purpose", "unit test of call sites"]
    text = CliRunner().invoke(main, ["replay", *arguments])
    assert text.exit_code == 1, text.output
    shown = text.stdout
    assert shown.index("call site") < shown.index("library frame") < shown.index("look_up")
    as_json = CliRunner().invoke(main, ["replay", *arguments, "--json"])
    [run, _] = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert run["divergence"]["call_site"]["library"]["function"] == "look_up"
