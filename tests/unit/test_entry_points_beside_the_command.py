"""An entry point names a module of the folder the command runs in, as the docs' own
tutorial does (``--agent my_agent:agent`` from the agent's folder), although the
``blackbox`` script does not put that folder on the import path; an installed module of
the same name still wins, and a module that is nowhere is still named as missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent_blackbox.replayer._registry import UnknownAgent, load_entry


@pytest.fixture
def beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    here = str(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", here)])
    return tmp_path


def test_an_agent_module_beside_the_command_is_found(beside: Path) -> None:
    (beside / "agent_beside_the_command.py").write_text(
        "def agent(run, input):\n    return input\n"
    )
    entry = load_entry("agent_beside_the_command:agent")
    assert entry(None, 7) == 7  # type: ignore[arg-type]
    assert sys.path[-1] == str(beside)  # searched after everything installed


def test_an_installed_module_is_not_shadowed_and_a_missing_one_is_named(beside: Path) -> None:
    (beside / "json.py").write_text("def agent(run, input):\n    return 'shadow'\n")
    with pytest.raises(UnknownAgent, match="has no 'agent'"):
        load_entry("json:agent")  # the standard library's json, not the file here
    with pytest.raises(UnknownAgent, match="No module named 'nowhere_at_all'"):
        load_entry("nowhere_at_all:agent")
