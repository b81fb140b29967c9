"""Replay of runs read back from the real Kafka topic, through the events index."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from agent_blackbox.cli import main
from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.examples.ticket_agent import replay_entry
from agent_blackbox.outbox import PostgresBlobs, Recorder
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import DivergenceKind, KafkaRunSource, replay_run
from agent_blackbox.schemas import Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._views import build_views

pytestmark = pytest.mark.integration


def _publish(settings: Settings, engine: Engine, count: int) -> list[str]:
    recorded = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(count))
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=sum(r.events for r in recorded))
    return [r.run_id for r in recorded]


def test_runs_fetched_back_from_kafka_replay_offline(settings: Settings, engine: Engine) -> None:
    run_ids = _publish(settings, engine, 5)
    blobs = PostgresBlobs(engine)
    for run_id in run_ids:
        source = KafkaRunSource(settings, ViewRunIndex(engine), run_id)
        assert source.agent_id == "ticket-agent"
        report = replay_run(source, replay_entry, blobs=blobs)
        assert report.passed, report.divergence and report.divergence.describe()
        assert report.events == source.count == 11

    def changed(run: object, input: dict[str, str]) -> object:
        return replay_entry(run, {"ticket_id": input["ticket_id"] + "-x"})  # type: ignore[arg-type]

    report = replay_run(KafkaRunSource(settings, ViewRunIndex(engine), run_ids[0]), changed)
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.sequence) == (
        DivergenceKind.ARGUMENT_MISMATCH,
        2,
    )


def test_batch_replay_command_summarises_a_history(settings: Settings, engine: Engine) -> None:
    run_ids = _publish(settings, engine, 4)
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": "ticket-agent=agent_blackbox.examples.ticket_agent:replay_entry",
    }
    refused = CliRunner(env=env).invoke(main, ["replay", "--all"])
    assert refused.exit_code == 2
    assert "--purpose" in refused.output  # reading recorded bodies needs a stated reason
    env["BLACKBOX_PURPOSE"] = "regression test of a new code version"
    result = CliRunner(env=env).invoke(main, ["replay", "--all", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["runs"] == len(run_ids)
    assert summary["pass_rate"] == 1.0
    assert summary["divergence_kinds"] == {}

    single = CliRunner(env=env).invoke(main, ["replay", run_ids[0]])
    assert single.exit_code == 0
    assert "PASS" in single.stdout

    unknown = CliRunner(env=env).invoke(main, ["replay", "no-such-run"])
    assert unknown.exit_code == 2
    assert "not in the events index" in unknown.stderr
