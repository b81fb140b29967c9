"""Replay of runs read back from the real Kafka topic, through the events index."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    TicketAgent,
    replay_entry,
    sample_tickets,
)
from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import DivergenceKind, KafkaRunSource, replay_run
from agent_blackbox.schemas import PayloadPipeline, Settings
from tests.golden.record_key_order import UNSORTED_INPUT, KeyOrderAgent
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


def test_values_read_back_from_kafka_come_back_in_their_recorded_key_order(
    settings: Settings, engine: Engine
) -> None:
    # One run plain (SHA-256 digests: replay's fast path), one sealed (keyed digests).
    provider = LocalKeyProvider({"v1": os.urandom(32)})
    recorded: list[Any] = []
    runs = []
    for keys in (None, DataKeyStore(provider)):
        recorder = Recorder(engine, settings=settings, keys=keys)
        agent = KeyOrderAgent(sort_keys=False, seen=recorded)
        snapshot = RunSnapshot("key-order.1", input=UNSORTED_INPUT)
        run, _ = recorder.record(agent, snapshot, agent_id="key-order")
        runs.append((run.run_id, keys is not None))
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=2 * 8)
    for (run_id, sealed), wanted in zip(runs, recorded, strict=True):
        replayed: list[Any] = []
        keys = AuditedKeys(engine, provider, purpose="key order check") if sealed else None
        report = replay_run(
            KafkaRunSource(settings, ViewRunIndex(engine), run_id),
            KeyOrderAgent(sort_keys=False, seen=replayed),
            pipeline=PayloadPipeline(sealer=AesGcmSealer(keys)) if keys else None,
            digests=keys,
        )
        assert report.passed, report.error or (report.divergence and report.divergence.describe())
        assert json.dumps(replayed) == json.dumps([wanted])


def _cli_env(settings: Settings) -> dict[str, str | None]:
    return {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": "ticket-agent=agent_blackbox.examples.ticket_agent:replay_entry",
        "BLACKBOX_PURPOSE": None,
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }


def _lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_batch_replay_command_summarises_a_history(settings: Settings, engine: Engine) -> None:
    run_ids = _publish(settings, engine, 4)
    env = _cli_env(settings)
    refused = CliRunner(env=env).invoke(main, ["replay", "--all"])
    assert refused.exit_code == 2
    assert "--purpose" in refused.output  # reading recorded bodies needs a stated reason
    env["BLACKBOX_PURPOSE"] = "regression test of a new code version"
    result = CliRunner(env=env).invoke(main, ["replay", "--all", "--json"])
    assert result.exit_code == 0, result.output
    lines = _lines(result)
    assert sorted(line["run_id"] for line in lines[:-1]) == sorted(run_ids)
    summary = lines[-1]
    assert summary["type"] == "summary"
    assert summary["runs"] == len(run_ids)
    assert summary["pass_rate"] == 1.0
    assert summary["divergence_kinds"] == {}
    assert summary["failing_run_ids"] == []

    single = CliRunner(env=env).invoke(main, ["replay", run_ids[0]])
    assert single.exit_code == 0
    assert "PASS" in single.stdout

    unknown = CliRunner(env=env).invoke(main, ["replay", "no-such-run", "--json"])
    assert unknown.exit_code == 2
    assert "not in the events index" in unknown.stderr
    [line, summary] = _lines(unknown)
    assert (line["run_id"], line["result"]) == ("no-such-run", "ERROR")
    assert summary["failing_run_ids"] == ["no-such-run"]

    nothing = CliRunner(env=env).invoke(main, ["replay", "--all", "--agent-id", "nobody"])
    assert nothing.exit_code == 2
    assert "nothing matched in the run index" in nothing.stderr
    assert "of agent 'nobody'" in nothing.stderr

    # --random draws --limit runs across the history, not the oldest: 12 draws of one
    # run out of four leave the same run every time with a chance of 1 in 4**11.
    index = ViewRunIndex(engine)
    oldest = index.runs(finished_only=True, limit=1)
    draws = {tuple(index.runs(finished_only=True, limit=1, random=True)) for _ in range(12)}
    assert len(draws) > 1, (oldest, draws)
    random_two = ["replay", "--all", "--random", "--limit", "2", "--json"]
    drawn = CliRunner(env=env).invoke(main, random_two)
    assert drawn.exit_code == 0, drawn.output
    assert len(_lines(drawn)) == 3
    assert _lines(drawn)[-1]["filters"] == "finished runs, a random draw of 2, forks excluded"


def test_forks_are_left_out_of_a_batch_unless_asked_for(settings: Settings, engine: Engine) -> None:
    parents = _publish(settings, engine, 2)
    agent = TicketAgent(sample_tickets(10), KeywordModel(), Notifier())
    snapshot = replace(agent.snapshot("T-00001"), parent_run_id=parents[0], changes={"m": "x"})
    fork, _ = Recorder(engine, settings=settings).record(
        agent.run, snapshot, agent_id="ticket-agent"
    )
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=2 * 11 + fork.last_sequence)

    index = ViewRunIndex(engine)
    assert sorted(index.runs(finished_only=True, include_forks=False)) == sorted(parents)
    assert fork.run_id in index.runs(finished_only=True)  # the default keeps them

    env = {**_cli_env(settings), "BLACKBOX_PURPOSE": "fork filtering test"}
    without = CliRunner(env=env).invoke(main, ["replay", "--all", "--json"])
    assert without.exit_code == 0, without.output
    assert sorted(line["run_id"] for line in _lines(without)[:-1]) == sorted(parents)
    assert _lines(without)[-1]["filters"] == "finished runs, forks excluded"
    with_forks = CliRunner(env=env).invoke(main, ["replay", "--all", "--include-forks", "--json"])
    assert with_forks.exit_code == 0, with_forks.output
    replayed = [line["run_id"] for line in _lines(with_forks)[:-1]]
    assert sorted(replayed) == sorted([*parents, fork.run_id])


def test_key_problems_are_errors_naming_the_run_never_divergences(
    settings: Settings, engine: Engine
) -> None:
    kek = os.urandom(32)
    provider = LocalKeyProvider({"v1": kek})
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(provider))
    [run] = record_ticket_runs(recorder, ticket_ids(1), workers=1)
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=run.events)
    env = {**_cli_env(settings), "BLACKBOX_PURPOSE": "key problems test"}

    sealed = CliRunner(env=env).invoke(main, ["replay", run.run_id, "--json"])
    assert sealed.exit_code == 2, sealed.output
    [line, _] = _lines(sealed)
    assert line["result"] == "ERROR"
    # Without keys, the run's keyed digests are the first thing it cannot check.
    assert line["error"].startswith("KeyUnavailable: ")
    assert (
        f"run {run.run_id} of tenant default was digested under the tenant's key" in (line["error"])
    )
    assert line["divergence"] is None

    env["BLACKBOX_KEK"] = f"v1:{base64.b64encode(kek).decode()}"
    opened = CliRunner(env=env).invoke(main, ["replay", run.run_id])
    assert opened.exit_code == 0, opened.output

    with engine.begin() as conn:
        conn.execute(text("DELETE FROM blackbox.data_keys"))
    missing = CliRunner(env=env).invoke(main, ["replay", "--all", "--json"])
    assert missing.exit_code == 2, missing.output
    [line, summary] = _lines(missing)
    assert line["error"].startswith(f"DataKeyMissing: run {run.run_id} key ")
    assert summary["failing_run_ids"] == [run.run_id]
    text_summary = CliRunner(env=env).invoke(main, ["replay", "--all"])
    assert text_summary.exit_code == 2
    assert "0/1 runs passed" in text_summary.stdout


def test_replay_results_are_kept_per_code_version(settings: Settings, engine: Engine) -> None:
    run_ids = _publish(settings, engine, 3)
    env = {**_cli_env(settings), "BLACKBOX_PURPOSE": "release check of v2"}
    passing = CliRunner(env=env).invoke(main, ["replay", "--all", "--code-version", "v2"])
    assert passing.exit_code == 0, passing.output
    env["BLACKBOX_AGENTS"] = "ticket-agent=tests.integration.test_replay_kafka:changed_entry"
    failing = CliRunner(env=env).invoke(main, ["replay", run_ids[0], "--code-version", "v3"])
    assert failing.exit_code == 1, failing.output

    with engine.connect() as conn:
        rates = dict(
            conn.execute(
                text(
                    "SELECT code_version, avg(passed::int) FROM blackbox_views.replay_results "
                    "GROUP BY code_version"
                )
            ).all()
        )
        kept = conn.execute(
            text(
                "SELECT run_id, result, divergence_kind, divergence_sequence, duration_ms, "
                "recorded_code_version FROM blackbox_views.replay_results "
                "WHERE code_version = 'v3'"
            )
        ).one()
    assert rates == {"v2": 1, "v3": 0}
    assert kept.run_id == run_ids[0]
    assert (kept.result, kept.divergence_kind, kept.divergence_sequence) == (
        "DIVERGED",
        "argument_mismatch",
        2,
    )
    assert kept.duration_ms > 0
    assert kept.recorded_code_version is not None


def changed_entry(run: object, input: dict[str, str]) -> object:
    """The ticket agent with a change: it asks for another ticket than it was given."""
    return replay_entry(run, {"ticket_id": input["ticket_id"] + "-x"})  # type: ignore[arg-type]
