"""Finding 10: agent-chosen run ids reached the terminal unescaped.

A tenant-A writer records runs whose ids carry an OSC 8 hyperlink, ``ESC[2J`` (clear
screen), U+202E (right-to-left override) and an emoji shortcode, on the real stack. The
output of ``timeline``, ``replay`` (one run and ``--all``), ``forget`` and ``retention
run`` is captured: no escape, C1 control or bidi override reaches it, the id is shown
escaped, and ``:smile:`` prints as written, never as an emoji.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Settings
from tests._run_ids import unchecked_run_ids
from tests.conftest import Login
from tests.integration._views import build_views
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

KEK = os.urandom(32)
AGENT = "display"
HOSTILE = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\x1b[2J\u202e:smile:"
SHOWN = "\\x1b]8;;https://evil.example/"  # how the id's start is printed, escaped
FORBIDDEN = ("\x1b", "\x9b", "\u202e", "\U0001f604")  # ESC, CSI, RLO, the :smile: emoji


def agent(run: AgentRun, input: Any) -> Any:
    found = run.call("lookup", lambda who: {"note": f":smile: {who}\x1b[2J"}, input["who"])
    return found["note"]


def _record(owner: Engine, settings: Settings, *, subject: str) -> str:
    # Recorded as before the run id rule (or restored from then, or forged on the topic):
    # only the schema's owner may still write such an id.
    recorder = Recorder(owner, settings=settings, keys=DataKeyStore(LocalKeyProvider({"v1": KEK})))
    with unchecked_run_ids():
        run, _ = recorder.record(
            agent,
            RunSnapshot(code_version="display.1", input={"who": subject}),
            agent_id=AGENT,
            tenant_id=TENANT_A,
            subject_ids=(subject,),
            run_id=f"run-{os.urandom(4).hex()}-{HOSTILE}",
        )
    return run.run_id


def _env(settings: Settings) -> dict[str, str | None]:
    return {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": f"{AGENT}={__name__}:agent",
        "BLACKBOX_KEK": f"v1:{base64.b64encode(KEK).decode()}",
        "BLACKBOX_KEK_FILE": None,
        "BLACKBOX_PURPOSE": "finding 10 display check",
        "BLACKBOX_RETENTION_FILE": None,
        "COLUMNS": "400",
    }


def _clean(result: Result, *, expect_exit: int = 0) -> str:
    """The command's whole output, checked: it ran, and nothing hostile reached it."""
    output = result.output
    assert result.exit_code == expect_exit, output
    for char in FORBIDDEN:
        assert char not in output, f"{char!r} reached the terminal"
    return output


def test_hostile_run_ids_print_escaped_everywhere(
    engine: Engine, settings: Settings, login: Login
) -> None:
    forgotten_subject = f"subject-{os.urandom(4).hex()}"
    forgotten = _record(engine, settings, subject=forgotten_subject)
    expiring = _record(engine, settings, subject=f"subject-{os.urandom(4).hex()}")
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()
    build_views(settings, engine, expect=6)
    runner = CliRunner(env=_env(settings))

    for args in (["timeline", forgotten], ["timeline", forgotten, "--bodies"]):
        shown = _clean(runner.invoke(main, [*args, "--purpose", "finding 10 display check"]))
        assert SHOWN in shown
        assert ":smile:" in shown
    assert "\\x1b[2J" in shown  # the body's own escape sequence, shown escaped

    one = _clean(runner.invoke(main, ["replay", forgotten]))
    assert "PASS" in one
    assert SHOWN in one
    assert ":smile:" in one
    every = _clean(runner.invoke(main, ["replay", "--all"]))
    assert "2/2 runs passed" in every

    forgot = _clean(runner.invoke(main, ["forget", "--subject", forgotten_subject]))
    assert SHOWN in forgot
    assert ":smile:" in forgot

    with engine.begin() as conn:  # the owner ages the other run past its bodies' retention
        conn.execute(
            text(
                "UPDATE blackbox.runs SET updated_at = now() - interval '40 days' WHERE run_id = :r"
            ),
            {"r": expiring},
        )
    retained = _clean(runner.invoke(main, ["retention", "run"]))
    assert "1 runs shredded" in retained
    assert SHOWN in retained
    assert ":smile:" in retained
