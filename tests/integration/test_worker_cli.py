"""``blackbox relay --until-idle`` and ``blackbox consume --until-idle``: drain and exit,
alike in meaning, output and exit status."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import Settings
from tests.integration._agents import record_ticket_runs, ticket_ids

pytestmark = pytest.mark.integration


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
        **extra,
    }


def _outbox_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one())


def _summary(result: Result, counts: str) -> None:
    """The shape both commands share: one summary line on stdout, the idle stop on stderr."""
    assert result.exit_code == 0, result.output
    assert re.fullmatch(rf"{counts} in \d+\.\d s\n", result.stdout), result.stdout
    assert "idle for 1 s: stopping" in result.stderr


def test_relay_and_consume_drain_and_exit_alike(settings: Settings, engine: Engine) -> None:
    recorded = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(5))
    total = sum(r.events for r in recorded)
    runner = CliRunner(env=_env(settings))

    relayed = runner.invoke(main, ["relay", "--until-idle", "1"])
    _summary(relayed, f"{total} events published")
    assert _outbox_rows(engine) == 0

    consumed = runner.invoke(main, ["consume", "--until-idle", "1"])
    _summary(consumed, f"{total} messages: {total} events inserted, .*")

    again = runner.invoke(main, ["relay", "--until-idle", "1"])  # nothing left: exits too
    _summary(again, "0 events published")


def test_both_exit_2_when_they_cannot_run(settings: Settings) -> None:
    env = _env(settings, BLACKBOX_DATABASE_URL="postgresql+psycopg://nobody@127.0.0.1:1/none")
    for command in ("relay", "consume"):
        result = CliRunner(env=env).invoke(main, [command, "--until-idle", "1"])
        assert result.exit_code == 2, (command, result.output)
        assert "error:" in result.stderr
        if command == "relay":
            assert "the outbox could not be drained" in result.stderr
