"""Every audited read of keys states a purpose the audit can show as it is: a line break
would forge a line of the server's log, so the key store itself refuses one."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from agent_blackbox.cli import main
from agent_blackbox.keystore import AccessDenied, AuditedKeys, LocalKeyProvider


@pytest.mark.parametrize(
    ("purpose", "why"),
    [
        ("incident 1\nLOG:  forged line", "U+000A"),
        ("incident 1\x1b[2J", "U+001B"),
        ("incident \u202e1", "U+202E"),
        ("ok", "too short"),
        ("x" * 501, "too long"),
    ],
)
def test_the_audited_key_reader_refuses_a_purpose_the_audit_cannot_show(
    purpose: str, why: str
) -> None:
    engine: Any = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never used
    provider = LocalKeyProvider({"v1": b"k" * 32}, current="v1")
    with pytest.raises(AccessDenied, match=why.replace("+", r"\+")):
        AuditedKeys(engine, provider, purpose=purpose)


@pytest.mark.parametrize("command", [("replay", "some-run"), ("timeline", "r", "--bodies")])
def test_a_command_that_needs_a_purpose_names_both_ways_to_give_it(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLACKBOX_PURPOSE", raising=False)
    result = CliRunner().invoke(main, list(command))
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "--purpose" in said
    assert "BLACKBOX_PURPOSE" in said
