"""View throughput: the ViewConsumer building the runs view and the events index.

Cloned runs of a recorded template (see ``bench._synthetic``) are produced to a fresh
topic first; then a ViewConsumer in a fresh group consumes them. The rate counts from
the commit of the first batch to the commit that puts the last event into the index,
so the group join is left out (``startup_s`` is the time to the first commit);
``consumer_cpu_us_per_event`` is the consumer process's own CPU time over the same span.

Then the index is used as replay uses it: ``run_read_ms`` is the time to read one run
back from the topic through the index (the median and p95 of a sample of runs, each
written interleaved with all the others, as concurrent writers leave them).

Last, ``visible_ms``: a caught-up view consumer while events are published at a steady
rate (``--rate`` events/s, the relay's producer settings), the time from handing an
event to the producer to the commit of the batch that put it into the views (p50, p99).
The first ``--warmup`` seconds are published but left out of the figure, as in
``bench.latency``: a new producer's first messages wait for its connections and the
topic's metadata, hundreds of milliseconds that no running relay pays.

    python -m bench.views [--events 50000] [--rate 1000] [--seconds 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, create_engine, func, select

from agent_blackbox.broker import (
    ensure_topics,
    new_producer,
    producer_config,
)
from agent_blackbox.consumers import (
    BatchOutcome,
    ConsumerRuntime,
    Delivered,
    ViewConsumer,
    ViewRunIndex,
    Vouching,
    apply_batch,
    consumer_offsets,
    events_index,
    integrity_violations,
    migrate_views,
    runs_view,
    views_screen,
)
from agent_blackbox.replayer import KafkaRunSource
from agent_blackbox.schemas import Settings
from bench import _synthetic
from bench._common import (
    bench_settings,
    delete_group,
    delete_topics,
    drop_runs,
    emit,
    fresh_topic,
    percentile,
    run_counted,
    stage,
)

BENCH = "views"
EVENTS_TARGET = 20_000.0
VISIBLE_P99_TARGET_MS = 50.0
DEADLINE_S = 300.0
SAMPLE_RUNS = 20


def build_views(settings: Settings, *, group_id: str, events: int) -> tuple[float, float, float]:
    """Consume until ``events`` are in the index; (seconds to the first batch, events/s,
    the consumer's own CPU microseconds per event).

    The consumer runs as ``blackbox consume`` runs it (:meth:`ViewConsumer.run`, its
    batches pipelined). The rate leaves out the first batch, whose poll also joins the
    group. The CPU time (this process only, not the database's) varies less than the
    rate on a busy machine.
    """
    with ViewConsumer(settings, group_id=group_id, registry=CollectorRegistry()) as consumer:
        batches = run_counted(
            consumer,
            events=events,
            label="views",
            count=lambda outcome: outcome.inserted,
            deadline_s=DEADLINE_S,
        )
    measured, seconds, cpu = batches.measured(events, "events indexed")
    assert batches.first is not None
    return batches.first[0] - batches.opened, measured / seconds, cpu * 1e6 / measured


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


def visible_ms(
    settings: Settings, rows: Sequence[_synthetic.Row], *, group_id: str, rate: float
) -> list[float]:
    """Publish ``rows`` at ``rate`` events/s to a caught-up view consumer; for each, in
    the order published, the milliseconds from handing it to the producer to the commit
    that applied it."""
    sent: dict[str, float] = {}
    applied: list[Delivered] = []
    latencies: dict[str, float] = {}

    vouching = Vouching()

    def project(conn: Connection, records: Sequence[Delivered]) -> BatchOutcome:
        applied.extend(records)
        return apply_batch(conn, records, vouching=vouching)

    consumer = ConsumerRuntime(
        settings,
        project,
        name="views-latency",
        group_id=group_id,
        screen=views_screen,
        registry=CollectorRegistry(),
    )
    with consumer:
        deadline = time.perf_counter() + 60
        while not consumer.assigned or consumer.lag() != 0:  # join and catch up first
            if time.perf_counter() > deadline:
                raise RuntimeError("the latency consumer got no partitions in 60 s")
            consumer.poll_once(0.1)
        publisher = threading.Thread(target=_publish, args=(settings, rows, rate, sent))
        publisher.start()
        try:
            deadline = time.perf_counter() + len(rows) / rate + 60
            while len(latencies) < len(rows) and time.perf_counter() < deadline:
                applied.clear()
                if consumer.poll_once(0.5) is None:  # as run() polls
                    continue
                now = time.perf_counter()
                for record in applied:
                    event_id = record.envelope.event_id
                    latencies[event_id] = (now - sent[event_id]) * 1000
        finally:
            publisher.join()
    if len(latencies) < len(rows):
        raise RuntimeError(f"only {len(latencies)} of {len(rows)} events became visible")
    return [latencies[row.event_id] for row in rows]


def _publish(
    settings: Settings, rows: Sequence[_synthetic.Row], rate: float, sent: dict[str, float]
) -> None:
    """Hand ``rows`` to a producer with the relay's settings, ``rate`` per second, in
    ticks of 10 ms."""
    producer = new_producer(settings, producer_config(settings))
    started = time.perf_counter()
    for index, row in enumerate(rows):
        due = started + index / rate
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)  # pacing the publisher, not synchronisation
        sent[row.event_id] = time.perf_counter()
        producer.produce(settings.topic, key=row.run_id.encode(), value=row.envelope)
        producer.poll(0)
    producer.flush(60)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=1_000.0, help="events/s for visible_ms")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to measure")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds left out first")
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    group_id = f"blackbox.bench.views.{uuid.uuid4().hex[:12]}"
    latency = replace(settings, topic=fresh_topic("views.latency"))
    latency_group = f"{group_id}.latency"
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
            _synthetic.register(engine, rows)
            _synthetic.produce(settings, settings.topic, rows)
        with stage("view consumer"):
            startup, rate, cpu = build_views(settings, group_id=group_id, events=len(rows))
        if (held := indexed(engine, settings.topic)) != len(rows):
            raise RuntimeError(f"the events index holds {held} events, expected {len(rows)}")
        emit(BENCH, "events_per_s", rate, unit="events/s", target=EVENTS_TARGET)
        emit(BENCH, "startup_s", startup, unit="s")
        emit(BENCH, "consumer_cpu_us_per_event", cpu, unit="us")
        sample = sorted({row.run_id for row in rows})[:SAMPLE_RUNS]
        with stage(f"read {len(sample)} runs back through the events index"):
            took = read_runs(settings, engine, sample)
        for q in (50, 95):
            emit(BENCH, "run_read_ms", percentile(took, q), unit="ms", percentile=q)
        warmup = int(args.rate * args.warmup)
        steady = list(
            _synthetic.rows(
                template,
                events=warmup + int(args.rate * args.seconds),
                shards=settings.outbox_shards,
            )
        )
        rows += steady
        _synthetic.register(engine, steady)
        ensure_topics(latency, {latency.topic: latency.partitions})
        with stage(f"publish {len(steady)} events at {args.rate:g}/s to a caught-up consumer"):
            took = visible_ms(latency, steady, group_id=latency_group, rate=args.rate)[warmup:]
        for q, target in ((50, None), (99, VISIBLE_P99_TARGET_MS)):
            emit(
                BENCH,
                "visible_ms",
                percentile(took, q),
                unit="ms",
                target=target,
                at_least=False,
                percentile=q,
                rate=int(args.rate),
            )
    finally:
        run_ids = sorted({row.run_id for row in rows})
        clean_views(engine, topic=settings.topic, group_id=group_id, run_ids=run_ids)
        clean_views(engine, topic=latency.topic, group_id=latency_group, run_ids=run_ids)
        drop_runs(engine, run_ids)
        delete_topics(
            settings, [settings.topic, settings.dlq_topic, latency.topic, latency.dlq_topic]
        )
        delete_group(settings, group_id)
        delete_group(settings, latency_group)
        engine.dispose()


if __name__ == "__main__":
    main()
