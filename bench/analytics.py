"""Analytics throughput: the analytics consumer building llm_calls, tool_calls and effects
while the views consumer builds the runs view from the same topic.

Cloned runs of a recorded template (see ``bench._synthetic``: LLM, tool, clock, random and
state events) are produced to a fresh topic; then ``blackbox consume`` runs in a process of
its own on the topic while an :class:`AnalyticsConsumer` in this process consumes it too.
``events_per_s`` counts from the analytics consumer's first commit to its last (the group
join left out), target 10,000 events/s.

    python -m bench.analytics [--events 50000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine

from agent_blackbox.broker import ensure_topics
from agent_blackbox.consumers import AnalyticsConsumer, migrate_views
from agent_blackbox.schemas import Settings
from bench import _synthetic
from bench._common import bench_settings, delete_topics, drop_runs, emit, run_counted, stage

BENCH = "analytics"
EVENTS_TARGET = 10_000.0
DEADLINE_S = 300.0


def analytics_rate(settings: Settings, *, events: int) -> float:
    """Events/s of the analytics consumer over ``events`` messages (first batch left out)."""
    group = f"blackbox.bench.analytics.{uuid.uuid4().hex[:12]}"
    with AnalyticsConsumer(settings, group_id=group, registry=CollectorRegistry()) as consumer:
        batches = run_counted(
            consumer,
            events=events,
            label="analytics",
            count=lambda outcome: outcome.messages,
            deadline_s=DEADLINE_S,
        )
    measured, seconds, _cpu = batches.measured(events, "messages went through")
    return measured / seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    engine = create_engine(settings.database_url)
    views: subprocess.Popen[bytes] | None = None
    rows: list[_synthetic.Row] = []
    try:
        migrate_views(settings.database_url)
        ensure_topics(settings, {settings.topic: settings.partitions})
        with stage(f"record a template run, clone and produce {args.events} events"):
            template = _synthetic.record_template(engine, settings)
            rows = list(
                _synthetic.rows(template, events=args.events, shards=settings.outbox_shards)
            )
            _synthetic.register(engine, rows)
            _synthetic.produce(settings, settings.topic, rows)
        env = {
            **os.environ,
            "BLACKBOX_TOPIC": settings.topic,
            "BLACKBOX_CONSUMER_GROUP": f"blackbox.bench.views.{uuid.uuid4().hex[:12]}",
        }
        views = subprocess.Popen(
            [sys.executable, "-m", "agent_blackbox", "consume", "--until-idle", "5"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with stage("analytics consumer beside the views consumer"):
            rate = analytics_rate(settings, events=len(rows))
        emit(BENCH, "events_per_s", rate, unit="events/s", target=EVENTS_TARGET, events=len(rows))
    finally:
        if views is not None:
            views.terminate()
            views.wait(timeout=30)
        drop_runs(engine, sorted({row.run_id for row in rows}))
        engine.dispose()
        delete_topics(settings, [settings.topic])


if __name__ == "__main__":
    main()
