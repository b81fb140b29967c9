"""Scale-out: 1, 2 and 4 relays over the outbox's shards, 1, 2 and 3 view consumers in
one group, each a ``blackbox relay`` / ``blackbox consume`` process of its own.

Relays (per count): the relays start on an empty outbox and the bench waits until they
share the shards fairly; then the outbox is filled with cloned runs (see
``bench._synthetic``) by one COPY, and ``relay_drain_events_per_s`` counts from that
commit until the outbox is empty. Then writers record at a steady ``--rate`` through
the public Recorder for ``--latency-seconds`` while a plain consumer watches the topic:
``relay_commit_to_visible_ms`` (p50, p99; timed as in ``bench.latency``).

View consumers (per count): the consumers start on an empty topic and the bench waits
until the group is stable with every member assigned partitions; then the topic is
filled, and ``views_events_per_s`` counts from the first to the last offset the group
stored with its view rows (the first batch's events left out, as in ``bench.views``).

Both need an outbox and a group nobody else uses while the bench runs. The whole bench
takes a few minutes; every process it starts is stopped (SIGTERM) when it ends.

    python -m bench.scaleout [--relays 1,2,4] [--consumers 1,2,3] [--events 60000]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, create_engine, text

from agent_blackbox.broker import ensure_topics, new_admin
from agent_blackbox.consumers import migrate_views
from agent_blackbox.schemas import Envelope, Settings
from bench import _pipeline, _synthetic
from bench._common import (
    bench_settings,
    console,
    delete_group,
    delete_topics,
    drop_runs,
    emit,
    fresh_topic,
    stage,
)
from bench.latency import bench_runs
from bench.relay import fill, messages_in, require_empty_outbox
from bench.views import clean_views

BENCH = "scaleout"
DEADLINE_S = 300.0


def _counts(listed: str) -> list[int]:
    try:
        counts = [int(part) for part in listed.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"{listed!r}: expected counts separated by commas, e.g. 1,2,4") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"{listed!r}: every count must be at least 1")
    return counts


def start_workers(
    stack: ExitStack, settings: Settings, command: str, count: int, *args: str
) -> list[_pipeline.Worker]:
    """``count`` ``blackbox <command>`` processes, stopped when ``stack`` closes; a
    relay gets its own lease owner id."""
    started = []
    for i in range(count):
        name = f"bench-{command}-{i}"
        extra = ["--relay-id", name] if command == "relay" else []
        worker = _pipeline.Worker(
            [command, *extra, *args], _pipeline.worker_env(settings), name=name
        )
        stack.callback(worker.stop)
        started.append(worker)
    return started


def drain_rate(engine: Engine, settings: Settings, rows: Sequence[_synthetic.Row]) -> float:
    """Fill the outbox in one transaction; events/s until the relays emptied it."""
    fill(engine, rows)
    committed = time.monotonic()
    while (left := _pipeline.outbox_rows(engine)) > 0:
        if time.monotonic() - committed > DEADLINE_S:
            raise RuntimeError(f"{left} rows still in the outbox after {DEADLINE_S:.0f} s")
        time.sleep(0.05)
    rate = len(rows) / (time.monotonic() - committed)
    if (held := messages_in(settings, settings.topic)) != len(rows):
        raise RuntimeError(f"{settings.topic} holds {held} messages, expected {len(rows)}")
    return rate


def steady_latency(
    settings: Settings, load: _pipeline.Load, *, agent_id: str
) -> tuple[_pipeline.Latencies, float]:
    """Commit → visible to a plain consumer under ``load`` (the consumer reads from the
    topic's end: the writers start seconds after it was assigned), and the events/s the
    writers reached."""
    watcher = _pipeline.PlainWatcher(settings, from_end=True)
    watcher.start()
    try:
        with _pipeline.Writers(settings, load, agent_id=agent_id) as writers:
            written = writers.result()
        _pipeline.wait_until_counted(
            lambda: watcher.received, len(written.commits), timeout=30, what="plain consumer"
        )
    finally:
        seen, _ = watcher.stop()
    return _pipeline.Latencies.between(written, seen, warmup_s=1.0), written.rate


def relay_figures(
    engine: Engine,
    settings: Settings,
    template: list[Envelope],
    *,
    count: int,
    events: int,
    load: _pipeline.Load,
    agent_id: str,
) -> None:
    """Drain rate and steady latency with ``count`` relays on a topic of their own."""
    with ExitStack() as stack:
        relays = start_workers(stack, settings, "relay", count)
        with stage(f"{count} relays share {settings.outbox_shards} shards"):
            split = _pipeline.wait_for_lease_split(engine, relays, settings.outbox_shards)
        console.log(f"shards per relay: {sorted(split.values())}")
        rows = list(_synthetic.rows(template, events=events, shards=settings.outbox_shards))
        with stage(f"{count} relays drain {len(rows):,} events"):
            rate = drain_rate(engine, settings, rows)
        drop_runs(engine, sorted({row.run_id for row in rows}))
        emit(BENCH, "relay_drain_events_per_s", rate, unit="events/s", relays=count)
        with stage(f"{count} relays under {load.rate:,.0f} events/s"):
            latencies, reached = steady_latency(settings, load, agent_id=agent_id)
        for q in (50, 99):
            emit(
                BENCH,
                "relay_commit_to_visible_ms",
                latencies.at(q),
                unit="ms",
                relays=count,
                percentile=q,
                rate=round(reached),
                events=len(latencies.ms),
                missing=latencies.missing,
            )


def group_ready(admin: AdminClient, group_id: str, members: int) -> bool:
    """Whether ``group_id`` is stable with ``members`` members, each assigned partitions."""
    try:
        description = admin.describe_consumer_groups([group_id])[group_id].result(timeout=10)
    except Exception:  # the group does not exist yet, or the broker is busy: not ready
        return False
    return (
        description.state == ConsumerGroupState.STABLE
        and len(description.members) == members
        and all(m.assignment and m.assignment.topic_partitions for m in description.members)
    )


def stored_offsets(engine: Engine, group_id: str) -> int:
    """How many messages the group has applied (its stored offsets, summed)."""
    query = text(
        "SELECT coalesce(sum(next_offset), 0) FROM blackbox_views.consumer_offsets "
        "WHERE group_id = :g"
    )
    with engine.connect() as conn:
        return int(conn.execute(query, {"g": group_id}).scalar_one())


def views_rate(engine: Engine, group_id: str, expected: int) -> float:
    """Events/s from the group's first stored batch to its last, the first left out."""
    deadline = time.monotonic() + DEADLINE_S
    first: tuple[float, int] | None = None
    while (applied := stored_offsets(engine, group_id)) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the group applied {applied} of {expected} in time")
        if applied and first is None:
            first = (time.monotonic(), applied)
        time.sleep(0.05)
    done = time.monotonic()
    if first is None or first[1] == expected:
        raise RuntimeError(f"{expected} events went in one batch; ask for more")
    return (expected - first[1]) / (done - first[0])


def consumer_figures(
    engine: Engine, settings: Settings, template: list[Envelope], *, count: int, events: int
) -> None:
    """Views built by ``count`` consumers in one group from a topic of their own."""
    group_id = f"blackbox.bench.scaleout.{uuid.uuid4().hex[:12]}"
    rows = list(_synthetic.rows(template, events=events, shards=settings.outbox_shards))
    try:
        with ExitStack() as stack:
            consumers = start_workers(stack, settings, "consume", count, "--group", group_id)
            admin = new_admin(settings.kafka_bootstrap)
            with stage(f"{count} consumers join group {group_id}"):

                def ready() -> bool:
                    for consumer in consumers:
                        if not consumer.alive():
                            raise RuntimeError(f"{consumer.name} exited:\n{consumer.output()}")
                    return group_ready(admin, group_id, count)

                _pipeline.wait_for(ready, timeout=120, what=f"{count} consumers to join", every=0.5)
            with stage(f"{count} consumers build the views of {len(rows):,} events"):
                _synthetic.produce(settings, settings.topic, rows)
                rate = views_rate(engine, group_id, len(rows))
        emit(BENCH, "views_events_per_s", rate, unit="events/s", consumers=count)
    finally:
        run_ids = sorted({row.run_id for row in rows})
        clean_views(engine, topic=settings.topic, group_id=group_id, run_ids=run_ids)
        delete_group(settings, group_id)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relays", default="1,2,4", help="relay counts")
    parser.add_argument("--consumers", default="1,2,3", help="view consumer counts")
    parser.add_argument("--events", type=int, default=60_000, help="events per figure")
    parser.add_argument("--rate", type=float, default=1_000.0, help="steady events/s")
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    relay_counts, consumer_counts = _counts(args.relays), _counts(args.consumers)
    settings = bench_settings(BENCH)
    engine = create_engine(settings.database_url)
    load = _pipeline.Load(rate=args.rate, seconds=args.latency_seconds)
    agent_id = f"bench-scaleout-{uuid.uuid4().hex[:8]}"
    topics: list[str] = []
    try:
        require_empty_outbox(engine)
        migrate_views(settings.database_url)
        with stage("record a template run"):
            template = _synthetic.record_template(engine, settings)
        for count in relay_counts:
            each = replace(settings, topic=fresh_topic(f"{BENCH}-relays{count}"))
            topics.append(each.topic)
            ensure_topics(each, {each.topic: each.partitions})
            relay_figures(
                engine,
                each,
                template,
                count=count,
                events=args.events,
                load=load,
                agent_id=agent_id,
            )
        for count in consumer_counts:
            each = replace(settings, topic=fresh_topic(f"{BENCH}-consumers{count}"))
            topics += [each.topic, each.dlq_topic]
            ensure_topics(each, {each.topic: each.partitions})
            consumer_figures(engine, each, template, count=count, events=args.events)
    finally:
        drop_runs(engine, bench_runs(engine, [agent_id]))
        delete_topics(settings, topics)
        engine.dispose()


if __name__ == "__main__":
    main()
