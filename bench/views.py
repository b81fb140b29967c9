"""View throughput: the ViewConsumer building the runs view and the events index.

Cloned runs of a recorded template (see ``bench._synthetic``) are produced to a fresh
topic first; then a ViewConsumer in a fresh group consumes them. The rate counts from
the commit of the first batch to the commit that puts the last event into the index,
so the group join is left out (``startup_s`` is the time to the first commit).

Then the index is used as replay uses it: ``run_read_ms`` is the time to read one run
back from the topic through the index (the median and p95 of a sample of runs, each
written interleaved with all the others, as concurrent writers leave them).

    python bench/views.py [--events 50000]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, create_engine, func, select

from agent_blackbox.broker import ensure_topics
from agent_blackbox.consumers import (
    ViewConsumer,
    ViewRunIndex,
    consumer_offsets,
    events_index,
    integrity_violations,
    migrate_views,
    runs_view,
)
from agent_blackbox.replayer import KafkaRunSource
from agent_blackbox.schemas import Settings
from bench import _synthetic
from bench._common import (
    bench_settings,
    delete_group,
    delete_topics,
    emit,
    percentile,
    progress,
    stage,
)

BENCH = "views"
EVENTS_TARGET = 5_000.0
DEADLINE_S = 300.0
SAMPLE_RUNS = 20


def build_views(settings: Settings, *, group_id: str, events: int) -> tuple[float, float]:
    """Consume until ``events`` are in the index; (seconds to the first batch, events/s).

    The rate leaves out the first batch, whose poll also joins the group.
    """
    opened = time.perf_counter()
    first: tuple[float, int] | None = None
    inserted = 0
    with (
        ViewConsumer(settings, group_id=group_id, registry=CollectorRegistry()) as consumer,
        progress() as display,
    ):
        task = display.add_task("views", total=events)
        while inserted < events:
            if time.perf_counter() - opened > DEADLINE_S:
                raise RuntimeError(f"only {inserted} of {events} events indexed in time")
            outcome = consumer.poll_once(0.1)
            if outcome is None:
                continue
            inserted += outcome.inserted
            display.advance(task, outcome.inserted)
            first = first or (time.perf_counter(), inserted)
        done = time.perf_counter()
    assert first is not None
    first_at, first_count = first
    if inserted == first_count:
        raise ValueError(f"{events} events fit one batch; ask for more to measure a rate")
    return first_at - opened, (inserted - first_count) / (done - first_at)


def indexed(engine: Engine, topic: str) -> int:
    """How many events of ``topic`` the events index holds."""
    query = select(func.count()).where(events_index.c.topic == topic)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def read_runs(settings: Settings, engine: Engine, run_ids: Sequence[str]) -> list[float]:
    """Read each run back through the events index; the milliseconds each took."""
    took = []
    for run_id in run_ids:
        started = time.perf_counter()
        source = KafkaRunSource(settings, ViewRunIndex(engine), run_id)
        if (read := sum(1 for _ in source)) != source.count:
            raise RuntimeError(f"run {run_id}: read {read} events, the index holds {source.count}")
        took.append((time.perf_counter() - started) * 1000)
    return took


def clean_views(engine: Engine, *, topic: str, group_id: str, run_ids: Sequence[str]) -> None:
    """Delete what the bench put into the views."""
    with engine.begin() as conn:
        conn.execute(events_index.delete().where(events_index.c.topic == topic))
        conn.execute(integrity_violations.delete().where(integrity_violations.c.topic == topic))
        conn.execute(runs_view.delete().where(runs_view.c.run_id.in_(run_ids)))
        conn.execute(consumer_offsets.delete().where(consumer_offsets.c.group_id == group_id))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    group_id = f"blackbox.bench.views.{uuid.uuid4().hex[:12]}"
    engine = create_engine(settings.database_url)
    rows: list[_synthetic.Row] = []
    try:
        migrate_views(settings.database_url)
        ensure_topics(settings, {settings.topic: settings.partitions})
        with stage(f"record a template run, clone and produce {args.events} events"):
            template = _synthetic.record_template(engine, settings)
            rows = list(
                _synthetic.rows(template, events=args.events, shards=settings.outbox_shards)
            )
            _synthetic.produce(settings, settings.topic, rows)
        with stage("view consumer"):
            startup, rate = build_views(settings, group_id=group_id, events=len(rows))
        if (held := indexed(engine, settings.topic)) != len(rows):
            raise RuntimeError(f"the events index holds {held} events, expected {len(rows)}")
        emit(BENCH, "events_per_s", rate, unit="events/s", target=EVENTS_TARGET)
        emit(BENCH, "startup_s", startup, unit="s")
        sample = sorted({row.run_id for row in rows})[:SAMPLE_RUNS]
        with stage(f"read {len(sample)} runs back through the events index"):
            took = read_runs(settings, engine, sample)
        for q in (50, 95):
            emit(BENCH, "run_read_ms", percentile(took, q), unit="ms", percentile=q)
    finally:
        run_ids = sorted({row.run_id for row in rows})
        clean_views(engine, topic=settings.topic, group_id=group_id, run_ids=run_ids)
        delete_topics(settings, [settings.topic, settings.dlq_topic])
        delete_group(settings, group_id)
        engine.dispose()


if __name__ == "__main__":
    main()
