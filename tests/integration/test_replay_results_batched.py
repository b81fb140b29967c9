"""``replay --all`` keeps its results in batches: every run of a batch once, in the
order the command reported them, with its own verdict, also when runs in the middle of a
batch diverge or fail."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.cli.commands import replay as replay_command
from agent_blackbox.consumers import ViewReplayResults, ViewStoreUnavailable
from agent_blackbox.examples.ticket_agent import replay_entry
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import ReplayReport, ReplaySetupError
from agent_blackbox.schemas import Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._views import build_views

pytestmark = pytest.mark.integration

DIVERGING = "T-00002"
FAILING = "T-00004"


def mixed_entry(run: Any, input: dict[str, str]) -> object:
    """The ticket agent, but one ticket's run asks for another ticket (a divergence) and
    another's cannot be set up (an error)."""
    if input["ticket_id"] == DIVERGING:
        return replay_entry(run, {"ticket_id": input["ticket_id"] + "-x"})
    if input["ticket_id"] == FAILING:
        raise ReplaySetupError(f"ticket {FAILING} cannot be set up in this test")
    return replay_entry(run, input)


def _publish(settings: Settings, engine: Engine, count: int) -> dict[str, str]:
    """Record ``count`` ticket runs and index them; run id → ticket id."""
    ids = ticket_ids(count)
    recorded = record_ticket_runs(Recorder(engine, settings=settings), ids)
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=sum(r.events for r in recorded))
    return {r.run_id: ticket for r, ticket in zip(recorded, ids, strict=True)}


def _kept(engine: Engine, code_version: str) -> list[tuple[str, str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, result, divergence_kind FROM blackbox_views.replay_results "
                "WHERE code_version = :v ORDER BY id"
            ),
            {"v": code_version},
        )
        return [(r[0], r[1], r[2]) for r in rows]


def test_every_run_of_every_batch_is_kept_once_in_order_with_its_verdict(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    tickets = _publish(settings, engine, 7)
    # Batches of 3: two whole ones (one with the divergence, one with the error in the
    # middle) and a last one of a single run, kept only when the command closes.
    monkeypatch.setattr(replay_command, "KEEP_BATCH", 3)
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": f"ticket-agent={__name__}:mixed_entry",
        "BLACKBOX_PURPOSE": "batched results test",
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }
    result = CliRunner(env=env).invoke(
        main, ["replay", "--all", "--json", "--workers", "1", "--code-version", "batched"]
    )
    assert result.exit_code == 1, result.output  # a divergence is a finding
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    reported = [(line["run_id"], line["result"]) for line in lines[:-1]]
    assert sorted(rid for rid, _ in reported) == sorted(tickets)

    kept = _kept(engine, "batched")
    assert [(rid, res) for rid, res, _ in kept] == reported
    verdicts = {tickets[rid]: (res, kind) for rid, res, kind in kept}
    assert verdicts.pop(DIVERGING) == ("DIVERGED", "argument_mismatch")
    assert verdicts.pop(FAILING) == ("ERROR", None)
    assert set(verdicts.values()) == {("PASS", None)}


def test_a_batch_is_kept_whole_or_not_at_all(settings: Settings, engine: Engine) -> None:
    run_ids = list(_publish(settings, engine, 2))
    results = ViewReplayResults(engine)
    reports = [ReplayReport(rid, "ticket-agent", 11, duration_ms=1.0) for rid in run_ids]

    with pytest.raises(ViewStoreUnavailable, match="run run-nowhere is not in the views"):
        results.record_many(
            [reports[0], ReplayReport("run-nowhere", None, 0), reports[1]],
            code_version="refused",
        )
    assert _kept(engine, "refused") == []

    results.record_many(reports[::-1], code_version="whole")
    assert _kept(engine, "whole") == [(rid, "PASS", None) for rid in run_ids[::-1]]
