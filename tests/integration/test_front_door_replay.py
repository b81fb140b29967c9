"""``agent_blackbox.replay(run_id, entry)`` on the real stack: runs recorded on Postgres,
published by the relay and indexed by the view consumer, found through the settings and
replayed with one call."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from sqlalchemy import Engine, select

import agent_blackbox as bb
from agent_blackbox.examples.ticket_agent import replay_entry
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import access_audit
from agent_blackbox.replayer import DivergenceKind
from agent_blackbox.schemas import Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._views import build_views

pytestmark = pytest.mark.integration

PURPOSE = "front door replay test"


def _published(recorder: bb.Recorder, settings: Settings, engine: Engine, count: int) -> list[str]:
    recorded = record_ticket_runs(recorder, ticket_ids(count), workers=1)
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=sum(r.events for r in recorded))
    return [r.run_id for r in recorded]


def _changed(run: Any, input: dict[str, str]) -> object:
    return replay_entry(run, {"ticket_id": input["ticket_id"] + "-x"})


def test_a_recorded_run_replays_with_one_call_and_a_change_diverges(
    settings: Settings, engine: Engine
) -> None:
    run_ids = _published(bb.Recorder(engine, settings=settings), settings, engine, 2)

    report = bb.replay(run_ids[0], replay_entry, settings=settings, purpose=PURPOSE)
    assert report.passed, report.error or (report.divergence and report.divergence.describe())
    assert (report.run_id, report.agent_id, report.events) == (run_ids[0], "ticket-agent", 11)

    diverged = bb.replay(run_ids[0], _changed, settings=settings, purpose=PURPOSE)
    assert diverged.divergence is not None
    assert (diverged.divergence.kind, diverged.divergence.sequence) == (
        DivergenceKind.ARGUMENT_MISMATCH,
        2,
    )

    path = "agent_blackbox.examples.ticket_agent:replay_entry"
    several = bb.replay([*run_ids, "no-such-run"], path, settings=settings, purpose=PURPOSE)
    assert [(r.run_id, r.result) for r in several] == [
        (run_ids[0], "PASS"),
        (run_ids[1], "PASS"),
        ("no-such-run", "ERROR"),
    ]
    assert several[2].error is not None
    assert "not in the events index" in several[2].error
    assert "blackbox consume" in several[2].error  # says what to do


def test_a_sealed_run_is_found_and_opened_through_the_environment(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    kek = os.urandom(32)
    keys = DataKeyStore(LocalKeyProvider({"v1": kek}))
    [run_id] = _published(bb.Recorder(engine, settings=settings, keys=keys), settings, engine, 1)
    for name, value in {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_PURPOSE": PURPOSE,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK", raising=False)

    without_keys = bb.replay(run_id, replay_entry)
    assert without_keys.result == "ERROR"
    assert without_keys.error is not None
    assert without_keys.error.startswith("KeyUnavailable: ")

    monkeypatch.setenv("BLACKBOX_KEK", f"v1:{base64.b64encode(kek).decode()}")
    report = bb.replay(run_id, replay_entry)
    assert report.passed, report.error or (report.divergence and report.divergence.describe())
    with engine.connect() as conn:
        purposes = conn.execute(
            select(access_audit.c.purpose).where(access_audit.c.run_id == run_id)
        ).scalars()
        assert set(purposes) == {PURPOSE}  # each unwrap audited with the stated purpose
