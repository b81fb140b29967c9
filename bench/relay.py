"""Relay throughput: ``Relay.drain`` against a plain producer sending the same bytes.

The outbox is filled with cloned runs of a recorded template (see ``bench._synthetic``)
by COPY. A plain confluent-kafka producer with the relay's own config then sends the
same keys, values and headers to one fresh topic and flushes; then the relay drains the
outbox into another. Both rates count from the first message to the last delivery.

The relay drains every shard, so the bench refuses to start on an outbox that holds
rows, and nothing else may write to it while the bench runs.

    python bench/relay.py [--events 100000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import Engine, create_engine, text

from agent_blackbox.broker import ensure_topics, watermarks
from agent_blackbox.outbox import pending_events_txn
from agent_blackbox.outbox.relay import Relay
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
RATIO_TARGET = 0.25
_COPY = "COPY blackbox.outbox (shard, run_id, sequence, event_id, envelope) FROM STDIN"


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


def plain_rate(settings: Settings, topic: str, rows: Sequence[_synthetic.Row]) -> float:
    """Events/s of a bare producer with the relay's config: produce all, then flush."""
    started = time.perf_counter()
    _synthetic.produce(settings, topic, rows)
    return len(rows) / (time.perf_counter() - started)


def relay_rate(engine: Engine, settings: Settings, expected: int) -> float:
    """Events/s of ``Relay.drain`` emptying the outbox into ``settings.topic``."""
    relay = Relay(engine, settings=settings, owner=f"bench-{settings.topic}")
    try:
        started = time.perf_counter()
        published = relay.drain(timeout=300)
        elapsed = time.perf_counter() - started
    finally:
        relay.close()
    if published != expected:
        raise RuntimeError(f"the relay published {published} events, expected {expected}")
    return published / elapsed


def messages_in(settings: Settings, topic: str) -> int:
    """How many messages ``topic`` holds, from its watermarks."""
    return sum(high - low for low, high in watermarks(settings, topic, timeout_s=10).values())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
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
        with stage("plain producer"):
            plain_eps = plain_rate(settings, plain.topic, rows)
        with stage("relay drain"):
            relay_eps = relay_rate(engine, settings, len(rows))
        for each in (settings, plain):
            if (held := messages_in(each, each.topic)) != len(rows):
                raise RuntimeError(f"{each.topic} holds {held} messages, expected {len(rows)}")
        emit(BENCH, "relay_events_per_s", relay_eps, unit="events/s", target=RELAY_TARGET)
        emit(BENCH, "plain_producer_events_per_s", plain_eps, unit="events/s")
        emit(
            BENCH, "relay_to_plain_ratio", relay_eps / plain_eps, unit="ratio", target=RATIO_TARGET
        )
    finally:
        drop_runs(engine, sorted({row.run_id for row in rows}))
        delete_topics(settings, [settings.topic, plain.topic])
        engine.dispose()


if __name__ == "__main__":
    main()
