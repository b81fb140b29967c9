"""Every audited read of keys states a purpose the audit can show as it is: a line break
would forge a line of the server's log, so the key store itself refuses one."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine

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
