"""The analytics views on the real stack: what they hold equals what was recorded, and a
rebuild from offset zero (a fresh group, the tables emptied) gives the same rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import (
    AnalyticsConsumer,
    ConsumerRuntime,
    RetentionJob,
    RetentionPolicy,
    ViewGauges,
    apply_analytics,
    effect_calls,
    llm_calls,
    llm_usage_txn,
    migrate_views,
    run_rollups,
    tool_calls,
    view_figures_txn,
    views_screen,
)
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.schemas import Envelope, EventType, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._backups import SIGNER, events, record, relay
from tests.integration._kafka import read_topic
from tests.integration._views import build_analytics, build_views
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration

TABLES = (llm_calls, tool_calls, effect_calls, run_rollups)


def _variant(ticket_id: str) -> dict[str, str]:
    """Prompt A/B: even tickets run prompt v1, odd ones v2."""
    return {"prompt_version": f"v{int(ticket_id[-1]) % 2 + 1}", "experiment": "greeting"}


def _rows(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        return {
            table.name: sorted(
                tuple(row) for row in conn.execute(select(table).order_by(*table.primary_key))
            )
            for table in TABLES
        }


@pytest.fixture
def recorded(settings: Settings, engine: Engine) -> list[Envelope]:
    migrate_views(settings.database_url)
    runs = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(8), tags=_variant)
    relay(engine, settings)
    total = sum(r.events for r in runs)
    return [e for _p, _o, e in read_topic(settings.kafka_bootstrap, settings.topic, expect=total)]


def test_the_analytics_hold_every_call_and_effect_as_recorded(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    outcome = build_analytics(settings, engine, group="analytics-a", expect=len(recorded))

    rows = _rows(engine)
    kept = {"run.started", "llm.call", "tool.call", "effect.intent", "effect.receipt"}
    assert outcome.duplicates == 0  # a first build: nothing was there already
    assert outcome.passed_over == sum(e.event_type not in kept for e in recorded) > 0
    llm = [e for e in recorded if e.event_type == EventType.LLM_CALL]
    tools = [e for e in recorded if e.event_type == EventType.TOOL_CALL]
    intents = [e for e in recorded if e.event_type == EventType.EFFECT_INTENT]
    receipts = [e for e in recorded if e.event_type == EventType.EFFECT_RECEIPT]
    assert llm
    assert tools
    assert intents
    assert len(rows["llm_calls"]) == len(llm)
    assert len(rows["tool_calls"]) == len(tools)
    assert len(rows["effects"]) == len(intents)
    with engine.connect() as conn:
        tokens = conn.execute(text("SELECT sum(total_tokens) FROM blackbox_views.llm_calls"))
        stored_tokens = tokens.scalar_one()
        models = conn.execute(
            text("SELECT model, count(*) FROM blackbox_views.llm_calls GROUP BY model")
        ).all()
        open_intents = conn.execute(
            text("SELECT count(*) FROM blackbox_views.effects WHERE receipt_sequence IS NULL")
        ).scalar_one()
    assert stored_tokens == sum(int(e.attributes.get("total_tokens", 0)) for e in llm)
    assert dict(models) == {
        m: sum(1 for e in llm if e.attributes.get("model") == m)
        for m in {e.attributes.get("model") for e in llm}
    }
    assert open_intents == len(intents) - len(receipts)
    build_views(settings, engine, expect=len(recorded))  # code versions are the runs view's
    with engine.connect() as conn:
        [usage] = llm_usage_txn(conn, by="code_version", since=datetime(2000, 1, 1, tzinfo=UTC))
    assert usage.calls == len(llm)
    assert usage.total_tokens == stored_tokens
    started = [e for e in recorded if e.event_type == EventType.RUN_STARTED]
    assert usage.group == started[0].attributes["code_version"]  # one version, every run
    assert usage.latency_p50_ms is not None
    assert usage.latency_p50_ms <= usage.latency_p95_ms <= usage.latency_p99_ms
    with engine.connect() as conn:
        buckets = {
            size: (int(calls), int(tokens))
            for size, calls, tokens in conn.execute(
                text(
                    "SELECT bucket_size, sum(calls), sum(total_tokens) "
                    "FROM blackbox_views.llm_usage GROUP BY bucket_size"
                )
            )
        }
        tool_buckets = dict(
            conn.execute(
                text(
                    "SELECT bucket_size, sum(calls) FROM blackbox_views.tool_usage "
                    "GROUP BY bucket_size"
                )
            ).all()
        )
    assert buckets == {"minute": (len(llm), stored_tokens), "hour": (len(llm), stored_tokens)}
    assert tool_buckets == {"minute": len(tools), "hour": len(tools)}


def _expected_rollups(recorded: list[Envelope]) -> dict[str, tuple[Any, ...]]:
    """Per run, computed from the envelopes: prompt version, tags, LLM calls, tool calls,
    errors, total tokens, models."""
    expected: dict[str, tuple[Any, ...]] = {}
    for run_id in {e.run_id for e in recorded}:
        mine = [e for e in recorded if e.run_id == run_id]
        [started] = [e for e in mine if e.event_type == EventType.RUN_STARTED]
        llm = [e for e in mine if e.event_type == EventType.LLM_CALL]
        tools = [e for e in mine if e.event_type == EventType.TOOL_CALL]
        tags = {k.removeprefix("tag."): v for k, v in started.attributes.items() if k[:4] == "tag."}
        expected[run_id] = (
            started.attributes.get("prompt_templates"),
            tags.get("prompt_version"),
            tags,
            len(llm),
            len(tools),
            sum("error" in e.attributes for e in llm + tools),
            sum(int(e.attributes.get("total_tokens", 0)) for e in llm),
            sorted({e.attributes["model"] for e in llm}),
        )
    return expected


def _rollups(engine: Engine) -> dict[str, tuple[Any, ...]]:
    r = run_rollups.c
    columns = (r.prompt_templates, r.prompt_version, r.tags, r.llm_calls, r.tool_calls, r.errors)
    columns = (*columns, r.total_tokens)
    with engine.connect() as conn:
        rows = conn.execute(select(r.run_id, *columns, r.models)).all()
    return {row[0]: (*row[1:-1], list(row[-1])) for row in rows}


def test_per_run_rollups_and_the_prompt_a_b_equal_the_recorded_runs(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    build_analytics(settings, engine, group="analytics-a", expect=len(recorded))

    assert _rollups(engine) == _expected_rollups(recorded)
    assert {facts[0][:7] for facts in _expected_rollups(recorded).values()} == {"triage@"}
    llm = [e for e in recorded if e.event_type == EventType.LLM_CALL]
    version_of = {run_id: facts[1] for run_id, facts in _expected_rollups(recorded).items()}
    with engine.connect() as conn:
        usage = llm_usage_txn(conn, by="prompt_version", since=datetime(2000, 1, 1, tzinfo=UTC))
    assert {u.group: (u.calls, u.total_tokens) for u in usage} == {
        version: (
            sum(1 for e in llm if version_of[e.run_id] == version),
            sum(
                int(e.attributes.get("total_tokens", 0))
                for e in llm
                if version_of[e.run_id] == version
            ),
        )
        for version in ("v1", "v2")
    }


def _poll(consumer: ConsumerRuntime, *, times: int) -> None:
    for _ in range(times):
        consumer.poll_once(0.5)


def test_the_views_after_a_crash_mid_stream_equal_a_clean_build(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    batches = 0

    def crashing(conn: Any, records: Any) -> Any:
        # Writes its rows, then dies before the commit, on the third batch.
        nonlocal batches
        outcome = apply_analytics(conn, records)
        batches += 1
        if batches == 3:
            raise RuntimeError("the consumer process died here")
        return outcome

    crashed = ConsumerRuntime(
        settings,
        crashing,
        name="analytics",
        group_id="analytics-crash",
        screen=views_screen,
        engine=engine,
        batch_size=7,
    )
    with crashed, pytest.raises(RuntimeError, match="died here"):
        _poll(crashed, times=200)  # the crash comes on the third batch
    assert batches == 3
    build_analytics(settings, engine, group="analytics-crash", expect=len(recorded) - 14)
    after_crash = _rows(engine)
    with engine.begin() as conn:
        for table in TABLES:
            conn.execute(table.delete())
    build_analytics(settings, engine, group="analytics-clean", expect=len(recorded))

    assert after_crash == _rows(engine)
    assert _rollups(engine) == _expected_rollups(recorded)


def test_a_rebuild_from_offset_zero_gives_the_same_rows(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    build_analytics(settings, engine, group="analytics-a", expect=len(recorded))
    first = _rows(engine)
    with engine.begin() as conn:
        for table in TABLES:
            conn.execute(table.delete())

    build_analytics(settings, engine, group="analytics-b", expect=len(recorded))
    again = _rows(engine)
    build_analytics(settings, engine, group="analytics-c", expect=len(recorded))  # delivered again

    assert again == first
    assert _rows(engine) == again


def test_replayability_classes_follow_a_forget(settings: Settings, engine: Engine) -> None:
    migrate_views(settings.database_url)
    forgotten = record(engine, settings, "ada")
    kept = record(engine, settings, "grace")
    relay(engine, settings)
    policy = RetentionPolicy.from_mapping({"standard": {"bodies_days": 30, "metadata_days": 400}})
    job = RetentionJob(engine, policy=policy, settings=settings, signer=SIGNER)
    assert job.forget("ada").redacted
    relay(engine, settings)
    build_views(settings, engine, expect=events(engine))

    with engine.connect() as conn:
        classes = dict(
            conn.execute(
                text("SELECT run_id, replayability FROM blackbox_views.run_replayability")
            ).all()
        )
    assert classes == {forgotten: "control_flow_only", kept: "full"}


def test_a_caught_up_consumer_reports_no_lag_per_partition(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    registry = CollectorRegistry()
    with AnalyticsConsumer(
        settings, group_id="analytics-lag", engine=engine, registry=registry
    ) as consumer:
        seen = 0

        def caught_up() -> bool:
            nonlocal seen
            outcome = consumer.poll_once(0.5)
            seen += outcome.messages if outcome is not None else 0
            return seen >= len(recorded)

        eventually(caught_up, timeout=60, what="every message through the analytics")
    lags = {
        sample.labels["partition"]: sample.value
        for metric in registry.collect()
        if metric.name == "blackbox_consumer_lag_messages"
        for sample in metric.samples
    }
    assert lags
    assert set(lags.values()) == {0.0}


def test_the_view_gauges_read_replayability_open_intents_and_violations(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    build_analytics(settings, engine, group="analytics-a", expect=len(recorded))
    build_views(settings, engine, expect=len(recorded))
    runs = len({e.run_id for e in recorded})
    with engine.begin() as conn:  # one intent whose receipt never came
        conn.execute(
            effect_calls.update()
            .where(effect_calls.c.run_id == recorded[0].run_id)
            .values(receipt_sequence=None, receipt_at=None, status=None)
        )
    registry = CollectorRegistry()
    gauges = ViewGauges(registry)
    with engine.connect() as conn:
        figures = view_figures_txn(conn, window=timedelta(hours=1), open_after=timedelta(0))
    gauges.show(figures)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("blackbox_runs_recent", replayability="full") == runs
    assert sample("blackbox_runs_replayable_ratio", replayability="full") == 1.0
    assert sample("blackbox_runs_replayable_ratio", replayability="none") == 0.0
    assert sample("blackbox_effect_intents_open") == 1
    assert (sample("blackbox_effect_intent_oldest_open_seconds") or 0) > 0
    assert sample("blackbox_integrity_violations_stored") == 0
    with engine.connect() as conn:
        later = view_figures_txn(conn, window=timedelta(hours=1), open_after=timedelta(hours=1))
    assert later.open_intents == 0


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "refund",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "number"}},
                "required": ["amount"],
            },
        },
    }
]


def _asking(arguments: str) -> Any:
    def agent(run: AgentRun, _: Any) -> None:
        call = {
            "id": "c",
            "type": "function",
            "function": {"name": "refund", "arguments": arguments},
        }
        reply = {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ]
        }
        request = {
            "model": "m",
            "messages": [{"role": "user", "content": "refund"}],
            "tools": _TOOLS,
        }
        run.llm(lambda _request: reply, request, provider="openai")

    return agent


def test_tool_arguments_that_break_the_declared_schema_are_counted(
    settings: Settings, engine: Engine
) -> None:
    migrate_views(settings.database_url)
    recorder = Recorder(engine, settings=settings)
    runs = {}
    for arguments in ('{"amount": 12.5}', '{"amount": "all of it"}'):
        run, _ = recorder.record(_asking(arguments), RunSnapshot(code_version="c"), agent_id="t")
        runs[arguments] = run.run_id
    relay(engine, settings)
    build_analytics(settings, engine, group="analytics-tools", expect=events(engine))

    with engine.connect() as conn:
        invalid = dict(
            conn.execute(select(llm_calls.c.run_id, llm_calls.c.tool_calls_invalid)).all()
        )
    assert invalid == {runs['{"amount": 12.5}']: 0, runs['{"amount": "all of it"}']: 1}


def test_stats_by_prompt_version_on_the_command_line(
    settings: Settings, engine: Engine, recorded: list[Envelope]
) -> None:
    build_analytics(settings, engine, group="analytics-a", expect=len(recorded))
    env = {"BLACKBOX_DATABASE_URL": settings.database_url}
    runner = CliRunner(env=env)
    shown = runner.invoke(main, ["stats", "--by", "prompt_version", "--since", "1h", "--json"])
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert sorted((line["prompt_version"], line["calls"]) for line in lines) == [
        ("v1", 4),
        ("v2", 4),
    ]
    empty = runner.invoke(main, ["stats", "--since", "2000-01-01T00:00", "--by", "tenant"])
    assert empty.exit_code == 0
    future = runner.invoke(main, ["stats", "--since", "2099-01-01"])
    assert future.exit_code == 2
    assert "in the future" in future.output
