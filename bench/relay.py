"""Relay throughput against a plain producer, and relay takeover after a kill -9.

The outbox is filled with cloned runs of a recorded template (see ``bench._synthetic``)
by COPY. A plain confluent-kafka producer with the relay's own config then sends the
same keys, values and headers (the event id and a lease stamp) to one fresh topic and
flushes; then the relay drains the outbox into another. Both rates count from the first
message to the last delivery. The plain producer asks for no delivery reports: it is
what the broker and the client can do, with nothing to track or delete.

The relay drains every shard, so the bench refuses to start on an outbox that holds
rows, and nothing else may write to it while the bench runs.

Takeover: two ``blackbox relay`` processes at the default lease settings share the
outbox while a feeder thread commits rows into every shard (about 1,000 a second). One
relay is killed with SIGKILL; the figure is the time from the kill to the first message,
read back from the topic, that the other relay published for one of the dead relay's
shards under its new (higher) lease epoch: when publishing of those shards resumed. The
median of a few trials is reported.

    python bench/relay.py [--events 100000] [--takeover-trials 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from confluent_kafka import OFFSET_END, Consumer, TopicPartition
from sqlalchemy import Engine, create_engine, text

from agent_blackbox.broker import ensure_topics, read_stamp, settle_heap, watermarks
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import pending_events_txn
from agent_blackbox.schemas import Settings
from bench import _synthetic
from bench._common import (
    bench_settings,
    delete_topics,
    drop_runs,
    emit,
    fresh_topic,
    progress,
    stage,
)

BENCH = "relay"
RELAY_TARGET = 20_000.0
RATIO_TARGET = 0.6
TAKEOVER_TARGET_S = 3.0
FEED_EVERY_S = 0.02
FEED_ROWS = 20
FEED_EVENTS = 60_000
"""Rows the feeder has for all takeover trials (about 20 s at 1,000 a second each)."""
_COPY = "COPY blackbox.outbox (shard, run_id, sequence, event_id, envelope) FROM STDIN"


@dataclass(frozen=True, slots=True)
class Rate:
    """Events/s of one side, and the CPU its process spent per event (all threads:
    Python, the lane's database driver and librdkafka's own). On a shared machine the
    CPU figure is the steadier of the two."""

    events_per_s: float
    cpu_us_per_event: float

    @classmethod
    def of(cls, events: int, elapsed_s: float, cpu_s: float) -> Rate:
        return cls(events / elapsed_s, cpu_s / events * 1e6)


def require_empty_outbox(engine: Engine) -> None:
    """Refuse to run where the relay would publish (and delete) someone else's events."""
    with engine.connect() as conn:
        waiting = pending_events_txn(conn)
    if waiting:
        raise RuntimeError(
            f"the outbox holds {waiting} rows; the bench's relay would publish them to its "
            "own topic. Drain them first (blackbox relay) or use another database"
        )


def fill(engine: Engine, rows: Sequence[_synthetic.Row]) -> None:
    """COPY ``rows`` into the outbox in one transaction, as committed writers leave them.

    The outbox is vacuumed first: dead rows left by earlier drains slow the relay's
    reads and deletes, and runs are only comparable from the same starting state.
    """
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("VACUUM blackbox.outbox"))
    with engine.begin() as conn, progress() as display:
        task = display.add_task("COPY into the outbox", total=len(rows))
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        with cursor.copy(_COPY) as copy:
            for i, row in enumerate(rows):
                copy.write_row((row.shard, row.run_id, row.sequence, row.event_id, row.envelope))
                if i % 5_000 == 4_999:
                    display.advance(task, 5_000)


def plain_rate(settings: Settings, topic: str, rows: Sequence[_synthetic.Row]) -> Rate:
    """Events/s of a bare producer with the relay's config: produce all, then flush."""
    started, cpu = time.perf_counter(), time.process_time()
    _synthetic.produce(settings, topic, rows, stamped=True)
    return Rate.of(len(rows), time.perf_counter() - started, time.process_time() - cpu)


def relay_rate(engine: Engine, settings: Settings, expected: int) -> Rate:
    """Events/s of ``Relay.drain`` emptying the outbox into ``settings.topic``."""
    relay = Relay(engine, settings=settings, owner=f"bench-{settings.topic}")
    try:
        started, cpu = time.perf_counter(), time.process_time()
        published = relay.drain(timeout=300)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        relay.close()
    if published != expected:
        raise RuntimeError(f"the relay published {published} events, expected {expected}")
    return Rate.of(published, elapsed, cpu)


def messages_in(settings: Settings, topic: str) -> int:
    """How many messages ``topic`` holds, from its watermarks."""
    return sum(high - low for low, high in watermarks(settings, topic, timeout_s=10).values())


def _spawn_relay(settings: Settings, owner: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
    }
    command = [sys.executable, "-m", "agent_blackbox.cli", "relay", "--relay-id", owner]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _leases(engine: Engine) -> dict[int, tuple[str | None, int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT shard, owner, epoch FROM blackbox.relay_leases"))
        return {int(shard): (owner, int(epoch)) for shard, owner, epoch in rows}


def _feed(engine: Engine, rows: Iterator[_synthetic.Row], stop: threading.Event) -> None:
    """Commit ``FEED_ROWS`` rows every ``FEED_EVERY_S`` until ``stop`` (or no rows)."""
    while not stop.wait(FEED_EVERY_S):
        chunk = [row for _, row in zip(range(FEED_ROWS), rows, strict=False)]
        if not chunk:
            return
        with engine.begin() as conn:
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            with cursor.copy(_COPY) as copy:
                for row in chunk:
                    copy.write_row(
                        (row.shard, row.run_id, row.sequence, row.event_id, row.envelope)
                    )


def _wait_for(probe: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.05)


def takeover_seconds(engine: Engine, settings: Settings, rows: Iterator[_synthetic.Row]) -> float:
    """One trial: seconds from SIGKILL of one of two relays to the first message the
    other published for the dead relay's shards under a newer epoch."""
    tag = uuid.uuid4().hex[:6]
    doomed, survivor = f"bench-a-{tag}", f"bench-b-{tag}"
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(engine, rows, stop), daemon=True)
    relays = [_spawn_relay(settings, doomed)]
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"bench-takeover-{tag}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    try:
        feeder.start()
        _wait_for(
            lambda: any(o == doomed for o, _ in _leases(engine).values()), 60, "first relay up"
        )
        relays.append(_spawn_relay(settings, survivor))
        _wait_for(
            lambda: {o for o, _ in _leases(engine).values()} == {doomed, survivor},
            60,
            "both relays holding shards",
        )
        held = {s: e for s, (o, e) in _leases(engine).items() if o == doomed}
        partitions = range(settings.partitions)
        consumer.assign([TopicPartition(settings.topic, p, OFFSET_END) for p in partitions])
        consumer.consume(1, 1.0)  # join the partitions at their ends before the kill
        relays[0].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        relays[0].wait(timeout=30)
        while time.monotonic() - killed_at < 60:
            for msg in consumer.consume(500, 0.05):
                if msg.error() is not None:
                    continue
                stamp = read_stamp(msg.headers())
                if stamp and stamp.shard in held and stamp.epoch > held[stamp.shard]:
                    return time.monotonic() - killed_at
        raise RuntimeError("the surviving relay published nothing of the dead one's shards")
    finally:
        stop.set()
        feeder.join(timeout=30)
        consumer.close()
        for relay in relays:
            if relay.poll() is None:
                relay.send_signal(signal.SIGTERM)
        for relay in relays:
            try:
                relay.wait(timeout=30)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait(timeout=30)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--takeover-trials", type=int, default=3)
    args = parser.parse_args(argv)
    settings = bench_settings(BENCH)
    plain = replace(settings, topic=fresh_topic(f"{BENCH}-plain"))
    engine = create_engine(settings.database_url)
    rows: list[_synthetic.Row] = []
    try:
        require_empty_outbox(engine)
        for each in (settings, plain):
            ensure_topics(each, {each.topic: each.partitions})
        with stage("record a template run and clone it"):
            template = _synthetic.record_template(engine, settings)
            rows = list(
                _synthetic.rows(template, events=args.events, shards=settings.outbox_shards)
            )
        with stage(f"COPY {len(rows)} rows into the outbox"):
            fill(engine, rows)
        # As ``blackbox relay`` does before its loop; both sides then run without the
        # collector rescanning the bench's own rows.
        settle_heap()
        with stage("plain producer"):
            plain_side = plain_rate(settings, plain.topic, rows)
        with stage("relay drain"):
            relay_side = relay_rate(engine, settings, len(rows))
        held = {each.topic: messages_in(each, each.topic) for each in (settings, plain)}
        for topic, count in held.items():
            if count < len(rows):
                raise RuntimeError(f"{topic} holds {count} messages, expected {len(rows)}")
        # A delivery the producer gave up on (message timeout) may still have been
        # written; its row stays and is published again: a duplicate, not a loss.
        emit(BENCH, "relay_duplicates", held[settings.topic] - len(rows), unit="messages")
        emit(
            BENCH,
            "relay_events_per_s",
            relay_side.events_per_s,
            unit="events/s",
            target=RELAY_TARGET,
        )
        emit(BENCH, "plain_producer_events_per_s", plain_side.events_per_s, unit="events/s")
        emit(
            BENCH,
            "relay_to_plain_ratio",
            relay_side.events_per_s / plain_side.events_per_s,
            unit="ratio",
            target=RATIO_TARGET,
        )
        emit(BENCH, "relay_cpu_per_event", relay_side.cpu_us_per_event, unit="us")
        emit(BENCH, "plain_producer_cpu_per_event", plain_side.cpu_us_per_event, unit="us")
        if args.takeover_trials > 0:
            feed_rows = list(
                _synthetic.rows(template, events=FEED_EVENTS, shards=settings.outbox_shards)
            )
            rows += feed_rows  # dropped at the end with the others
            feed = iter(feed_rows)
            trials = []
            for trial in range(args.takeover_trials):
                with stage(f"relay takeover after kill -9, trial {trial + 1}"):
                    trials.append(takeover_seconds(engine, settings, feed))
            emit(
                BENCH,
                "relay_takeover_after_kill_s",
                statistics.median(trials),
                unit="s",
                target=TAKEOVER_TARGET_S,
                at_least=False,
                trials=len(trials),
            )
    finally:
        drop_runs(engine, sorted({row.run_id for row in rows}))
        delete_topics(settings, [settings.topic, plain.topic])
        engine.dispose()


if __name__ == "__main__":
    main()
