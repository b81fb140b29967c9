"""The drill and restore commands refuse bad input before they touch anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from agent_blackbox.cli import main


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["drill", "--at", "2999-01-01"], "is in the future"),
        (["drill", "--purpose", "x"], "too short"),
        (["drill", "--purpose", "restore\ndrill"], "purpose"),
        (["restore", "--into", "", "--runs", "r", "--purpose", "a real purpose"], "--into"),
        (["restore", "--into", "Case 42", "--runs", "r", "--purpose", "a real purpose"], "--into"),
        (["restore", "--into", "c" * 25, "--runs", "r", "--purpose", "a real purpose"], "--into"),
        (["restore", "--into", "case42", "--purpose", "a real purpose"], "say which runs"),
        (["restore", "--into", "case42", "--runs", "r", "--since", "2999-01-01"], "future"),
        (["backup", "run", "--roll-seconds", "0"], "--roll-seconds"),
        (["backup", "run", "--give-up-after", "soon"], "such as 90s, 15m or 2h"),
        (["backup", "run", "--give-up-after", "0m"], "such as 90s, 15m or 2h"),
        (["drill", "--drop", "production"], "not a copy this command made"),
    ],
)
def test_bad_input_is_refused_with_exit_2_naming_it(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_a_drill_with_a_sample_and_no_entry_point_is_refused_before_it_restores() -> None:
    result = CliRunner(env={"BLACKBOX_AGENTS": None}).invoke(main, ["drill", "--sample", "5"])
    assert result.exit_code == 2, result.output
    assert "--sample 5 replays runs with the agents' entry points, and none is given" in (
        " ".join(result.output.split())
    )
