"""The view consumer against a real Postgres and a real Kafka broker.

Every test uses its own topic and consumer group (uuid suffix), so tests share the
database and the broker without seeing each other's rows or messages.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Message, Producer
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, create_engine, func, select, text

from agent_blackbox.broker import ensure_topics
from agent_blackbox.cli.commands.views import consume_command
from agent_blackbox.consumers import (
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_TOPIC,
    BatchOutcome,
    ConsumerRuntime,
    Delivered,
    OffsetsMoved,
    ViewConsumer,
    ViewStoreUnavailable,
    apply_batch,
    consumer_offsets,
    events_index,
    integrity_violations,
    load_fences,
    load_offsets,
    migrate_views,
    runs_view,
    views_screen,
)
from agent_blackbox.consumers._offsets import OffsetMove, advance_offsets
from agent_blackbox.schemas import Envelope, EnvelopeCodec, EventType, Settings

pytestmark = pytest.mark.integration

CODEC = EnvelopeCodec()
T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
Offsets = dict[tuple[str, int], int]


# -- waiting with a deadline ------------------------------------------------------------


def drive_until(predicate: Callable[[], bool], timeout: float, *, step: Callable[[], Any]) -> None:
    """Run ``step`` (which blocks on its own, e.g. a poll) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition did not hold within {timeout:.0f} s")
        step()


def consume_until(consumer: ConsumerRuntime, predicate: Callable[[], bool]) -> BatchOutcome:
    """Poll ``consumer`` until ``predicate`` holds; the sum of the batches it committed."""
    outcomes: list[BatchOutcome] = []

    def step() -> None:
        outcome = consumer.poll_once(0.3)
        if outcome is not None:
            outcomes.append(outcome)

    drive_until(predicate, 60, step=step)
    return sum(outcomes, BatchOutcome())


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def views_engine(engine: Engine) -> Engine:
    """The test's own database, both sides migrated (see conftest)."""
    return engine


@pytest.fixture
def consumer_settings(settings: Settings) -> Settings:
    suffix = uuid.uuid4().hex[:12]
    chosen = dataclasses.replace(
        settings,
        topic=f"{settings.topic}.consumers",  # deleted with the test's topic
        consumer_group=f"test-consumers-{suffix}",
        partitions=3,
    )
    ensure_topics(chosen)
    return chosen


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


@pytest.fixture
def make_consumer(
    consumer_settings: Settings, views_engine: Engine
) -> Iterator[Callable[..., ViewConsumer]]:
    created: list[ConsumerRuntime] = []

    def make(**kwargs: Any) -> ViewConsumer:
        kwargs.setdefault("registry", CollectorRegistry())
        consumer = ViewConsumer(consumer_settings, **kwargs)
        created.append(consumer)
        return consumer

    yield make
    for consumer in created:
        consumer.close()


@pytest.fixture
def producer(consumer_settings: Settings) -> Iterator[Callable[..., Offsets]]:
    """Produce ``(key, value)`` pairs as the relay does (key = run id, murmur2: the
    views flag an event on another partition); returns the last offset + 1 of each
    partition."""
    client = Producer(
        {
            "bootstrap.servers": consumer_settings.kafka_bootstrap,
            "acks": "all",
            "partitioner": "murmur2_random",
        }
    )
    delivered: list[Message] = []

    def on_delivery(error: Any, message: Message) -> None:
        assert error is None, error
        delivered.append(message)

    def produce(items: list[tuple[bytes, bytes | None]], topic: str | None = None) -> Offsets:
        delivered.clear()
        for key, value in items:
            client.produce(
                topic or consumer_settings.topic, key=key, value=value, on_delivery=on_delivery
            )
        assert client.flush(30) == 0
        ends: Offsets = {}
        for message in delivered:
            tp = (message.topic() or "", message.partition() or 0)
            ends[tp] = max(ends.get(tp, 0), (message.offset() or 0) + 1)
        return ends

    yield produce
    client.flush(10)


# -- envelopes ---------------------------------------------------------------------------


def envelope(run_id: str, sequence: int, event_type: str = "llm.call", **kw: Any) -> Envelope:
    marker = kw.pop("marker", "a")
    values: dict[str, Any] = {
        "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{sequence}/{marker}")),
        "run_id": run_id,
        "sequence": sequence,
        "event_type": event_type,
        "body_version": 1,
        "recorded_at": T0 + timedelta(seconds=sequence),
        "tenant_id": "tenant-1",
        "agent_id": "agent-1",
        "input_digest": f"in-{sequence}-{marker}",
        "output_digest": f"out-{sequence}-{marker}",
        "chain_hash": f"chain-{sequence}-{marker}",
        "payload": b"\x00sealed-bytes-never-read",
        **kw,
    }
    return Envelope(**values)


def run_events(run_id: str, middle: int, status: str | None) -> list[Envelope]:
    """run.started, ``middle`` llm.calls, and run.finished when ``status`` is given."""
    events = [
        envelope(
            run_id,
            1,
            EventType.RUN_STARTED,
            attributes={"code_version": "git:abc123", "parent_run_id": f"{run_id}-parent"},
        )
    ]
    events += [envelope(run_id, 2 + i) for i in range(middle)]
    if status is not None:
        events.append(
            envelope(run_id, middle + 2, EventType.RUN_FINISHED, attributes={"status": status})
        )
    return events


def encoded(envelopes: list[Envelope]) -> list[tuple[bytes, bytes | None]]:
    return [(e.run_id.encode(), CODEC.encode(e)) for e in envelopes]


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex}"


# -- reading the views -------------------------------------------------------------------


def scalar(engine: Engine, query: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(query).scalar_one()


def count_events(engine: Engine, run_ids: list[str]) -> int:
    query = select(func.count()).where(events_index.c.run_id.in_(run_ids))
    return int(scalar(engine, query))


def stored_offsets(engine: Engine, settings: Settings) -> Offsets:
    tps = [(settings.topic, p) for p in range(settings.partitions)]
    with engine.connect() as conn:
        found = load_offsets(conn, group_id=settings.consumer_group, partitions=tps)
    return {tp: offset for tp, offset in found.items() if offset is not None}


def caught_up(engine: Engine, settings: Settings, ends: Offsets) -> Callable[[], bool]:
    return lambda: all(stored_offsets(engine, settings).get(tp) == end for tp, end in ends.items())


def run_row(engine: Engine, run_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(runs_view).where(runs_view.c.run_id == run_id)).one()


# -- the tests ---------------------------------------------------------------------------


def test_migrate_views_is_idempotent(views_engine: Engine) -> None:
    migrate_views(_url(views_engine))
    migrate_views(_url(views_engine))
    query = text("SELECT version_num FROM blackbox_views.alembic_version_views")
    assert scalar(views_engine, query) == _views_head()


def _views_head() -> str:
    from alembic.script import ScriptDirectory

    from agent_blackbox.consumers._migrate import MIGRATIONS

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def test_envelopes_land_in_the_views(
    consumer_settings: Settings, views_engine: Engine, make_consumer: Any, producer: Any
) -> None:
    runs = {new_run_id(): (5, "succeeded"), new_run_id(): (3, "failed"), new_run_id(): (4, None)}
    envelopes = [e for run_id, (n, status) in runs.items() for e in run_events(run_id, n, status)]
    ends = producer(encoded(envelopes))
    consumer = make_consumer()

    outcome = consume_until(consumer, caught_up(views_engine, consumer_settings, ends))

    assert outcome == BatchOutcome(inserted=len(envelopes))
    for run_id, (middle, status) in runs.items():
        row = run_row(views_engine, run_id)
        expected_count = middle + (2 if status else 1)
        assert row.status == (status or "running")
        assert (row.event_count, row.last_sequence) == (expected_count, expected_count)
        assert row.started_at == T0 + timedelta(seconds=1)
        assert row.finished_at == (T0 + timedelta(seconds=expected_count) if status else None)
        assert row.last_event_at == T0 + timedelta(seconds=expected_count)
        assert (row.code_version, row.parent_run_id) == ("git:abc123", f"{run_id}-parent")
        assert (row.tenant_id, row.agent_id) == ("tenant-1", "agent-1")
    _assert_positions_match_kafka(consumer_settings, views_engine, envelopes)
    assert stored_offsets(views_engine, consumer_settings) == ends


def _assert_positions_match_kafka(
    settings: Settings, engine: Engine, envelopes: list[Envelope]
) -> None:
    """Each indexed event points at the Kafka message that really holds it."""
    c = events_index.c
    query = select(c.event_id, c.topic, c.partition, c.offset).where(
        c.run_id.in_({e.run_id for e in envelopes})
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    assert {row.event_id for row in rows} == {e.event_id for e in envelopes}
    messages = _read_all(settings, settings.topic, len(envelopes))
    in_kafka = {
        (m.topic(), m.partition(), m.offset()): CODEC.decode(m.value() or b"").event_id
        for m in messages
    }
    assert {(r.topic, r.partition, r.offset): r.event_id for r in rows} == in_kafka


def test_redelivery_changes_nothing_and_a_conflict_is_recorded_once(
    consumer_settings: Settings, views_engine: Engine, make_consumer: Any, producer: Any
) -> None:
    run_id = new_run_id()
    envelopes = run_events(run_id, 6, "succeeded")
    consumer = make_consumer()
    consume_until(
        consumer, caught_up(views_engine, consumer_settings, producer(encoded(envelopes)))
    )
    before = run_row(views_engine, run_id)

    forged = envelope(run_id, 3, marker="forged")
    ends = producer(encoded([*envelopes, forged, forged]))
    outcome = consume_until(consumer, caught_up(views_engine, consumer_settings, ends))

    assert outcome == BatchOutcome(duplicates=len(envelopes), violations=2)
    after = run_row(views_engine, run_id)
    assert (after.event_count, after.last_sequence, after.status) == (
        before.event_count,
        before.last_sequence,
        before.status,
    )
    assert count_events(views_engine, [run_id]) == len(envelopes)
    with views_engine.connect() as conn:
        (violation,) = conn.execute(
            select(integrity_violations).where(integrity_violations.c.run_id == run_id)
        ).all()
    assert (violation.kind, violation.sequence) == ("digest_mismatch", 3)
    assert violation.existing_chain_hash == "chain-3-a"
    assert violation.incoming_chain_hash == "chain-3-forged"
    assert violation.topic == consumer_settings.topic


def test_poison_goes_to_the_dead_letter_topic_and_consumption_continues(
    consumer_settings: Settings, views_engine: Engine, make_consumer: Any, producer: Any
) -> None:
    run_id = new_run_id()
    key = run_id.encode()
    first, last = envelope(run_id, 1, EventType.RUN_STARTED), envelope(run_id, 2)
    nul = envelope(run_id, 3, tenant_id="bad\x00tenant")
    poison: list[tuple[bytes, bytes | None]] = [
        (key, b"garbage"),
        (key, b""),
        (key, None),
        (key, CODEC.encode(nul)),
    ]
    registry = CollectorRegistry()
    consumer = make_consumer(registry=registry)

    ends = producer([(key, CODEC.encode(first)), *poison, (key, CODEC.encode(last))])
    outcome = consume_until(consumer, caught_up(views_engine, consumer_settings, ends))

    assert outcome == BatchOutcome(inserted=2, dead_lettered=4)
    assert count_events(views_engine, [run_id]) == 2
    labels = {"consumer": "views", "group": consumer.group_id, "topic": consumer_settings.topic}
    assert registry.get_sample_value("blackbox_consumer_dead_lettered_total", labels) == 4
    letters = _read_all(consumer_settings, consumer_settings.dlq_topic, 4)
    (tp,) = ends
    assert [m.value() for m in letters] == [value for _, value in poison]
    for message, original_offset in zip(letters, range(1, 5), strict=True):
        headers = dict(message.headers() or [])
        assert message.key() == key
        assert headers[DLQ_REASON]
        assert headers[DLQ_TOPIC] == consumer_settings.topic.encode()
        assert headers[DLQ_PARTITION] == str(tp[1]).encode()
        assert headers[DLQ_OFFSET] == str(original_offset).encode()
    assert b"not an envelope" in dict(letters[0].headers() or [])[DLQ_REASON]
    assert b"NUL" in dict(letters[3].headers() or [])[DLQ_REASON]


def _read_all(settings: Settings, topic: str, count: int) -> list[Message]:
    reader = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"dlq-probe-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    found: list[Message] = []
    try:
        reader.subscribe([topic])
        drive_until(
            lambda: len(found) >= count,
            30,
            step=lambda: found.extend(m for m in reader.consume(10, 0.5) if m.error() is None),
        )
    finally:
        reader.close()
    return sorted(found, key=lambda m: (m.partition() or 0, m.offset() or 0))


def test_a_new_consumer_resumes_from_the_stored_offsets(
    consumer_settings: Settings, views_engine: Engine, make_consumer: Any, producer: Any
) -> None:
    runs = [new_run_id() for _ in range(12)]
    envelopes = [e for run_id in runs for e in run_events(run_id, 48, "succeeded")]
    ends = producer(encoded(envelopes))

    first = make_consumer(batch_size=40)
    early = consume_until(first, lambda: count_events(views_engine, runs) >= 150)
    first.close()
    assert 150 <= early.inserted < len(envelopes)

    second = make_consumer(batch_size=500)
    rest = consume_until(second, caught_up(views_engine, consumer_settings, ends))

    assert rest == BatchOutcome(inserted=len(envelopes) - early.inserted)
    assert count_events(views_engine, runs) == len(envelopes)
    for run_id in runs:
        row = run_row(views_engine, run_id)
        assert row.event_count == row.last_sequence == 50
    assert stored_offsets(views_engine, consumer_settings) == ends


def test_a_dropped_database_connection_rewinds_and_loses_nothing(
    consumer_settings: Settings, views_engine: Engine, producer: Any
) -> None:
    runs = [new_run_id() for _ in range(6)]
    envelopes = [e for run_id in runs for e in run_events(run_id, 18, "cancelled")]
    ends = producer(encoded(envelopes))
    killed: list[int] = []

    def dropping_projection(conn: Connection, records: Any) -> BatchOutcome:
        outcome = apply_batch(conn, records)
        if len(killed) < 2:  # drop the connection after the work, before the commit
            pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
            with views_engine.connect() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
                admin.commit()
            killed.append(pid)
        return outcome

    consumer = ConsumerRuntime(
        consumer_settings,
        dropping_projection,
        name="flaky-views",
        screen=views_screen,
        batch_size=25,
        registry=CollectorRegistry(),
    )
    failures: list[Exception] = []

    def step() -> None:
        try:
            consumer.poll_once(0.3)
        except ViewStoreUnavailable as exc:
            failures.append(exc)

    try:
        drive_until(caught_up(views_engine, consumer_settings, ends), 60, step=step)
    finally:
        consumer.close()
    assert len(failures) == 2
    assert count_events(views_engine, runs) == len(envelopes)
    for run_id in runs:
        row = run_row(views_engine, run_id)
        assert (row.event_count, row.status) == (20, "cancelled")


def test_two_consumers_in_one_group_split_the_work_exactly_once(
    consumer_settings: Settings, views_engine: Engine, make_consumer: Any, producer: Any
) -> None:
    runs = [new_run_id() for _ in range(20)]
    envelopes = [e for run_id in runs for e in run_events(run_id, 28, "succeeded")]
    ends = producer(encoded(envelopes))
    one, two = make_consumer(batch_size=50), make_consumer(batch_size=50)
    totals = {"one": BatchOutcome(), "two": BatchOutcome()}

    def step() -> None:
        for name, consumer in (("one", one), ("two", two)):
            totals[name] += consumer.poll_once(0.2) or BatchOutcome()

    drive_until(caught_up(views_engine, consumer_settings, ends), 90, step=step)

    assert (totals["one"] + totals["two"]).inserted == len(envelopes)
    assert count_events(views_engine, runs) == len(envelopes)
    assert {run_row(views_engine, r).event_count for r in runs} == {30}


def test_apply_batch_deduplicates_within_one_batch(views_engine: Engine) -> None:
    run_id = new_run_id()
    started = envelope(run_id, 1, EventType.RUN_STARTED)
    records = [
        Delivered(started, "direct", 0, 0),
        Delivered(started, "direct", 0, 1),
        Delivered(envelope(run_id, 2), "direct", 0, 2),
        Delivered(envelope(run_id, 2, marker="other"), "direct", 0, 3),
    ]
    with views_engine.connect() as conn:
        outcome = apply_batch(conn, records)
        row = conn.execute(select(runs_view).where(runs_view.c.run_id == run_id)).one()
        conn.rollback()
    assert outcome == BatchOutcome(inserted=2, duplicates=1, violations=1)
    assert (row.event_count, row.last_sequence, row.status) == (2, 2, "running")


def test_the_consumer_creates_missing_topics(
    consumer_settings: Settings, views_engine: Engine, make_consumer: Any, producer: Any
) -> None:
    fresh = dataclasses.replace(
        consumer_settings,
        topic=f"{consumer_settings.topic}.fresh",
        consumer_group=f"test-fresh-{uuid.uuid4().hex[:12]}",
        partitions=2,
    )
    consumer = ViewConsumer(fresh, registry=CollectorRegistry())
    try:
        assert consumer.poll_once(0.3) is None  # starts: creates both topics, joins
        run_id = new_run_id()
        ends = producer(encoded(run_events(run_id, 2, "succeeded")), topic=fresh.topic)
        consume_until(consumer, caught_up(views_engine, fresh, ends))
    finally:
        consumer.close()
    assert run_row(views_engine, run_id).event_count == 4
    metadata = Consumer({"bootstrap.servers": fresh.kafka_bootstrap, "group.id": "probe"})
    try:
        topics = metadata.list_topics(timeout=10).topics
    finally:
        metadata.close()
    assert len(topics[fresh.topic].partitions) == 2
    assert fresh.dlq_topic in topics


def _cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
        "BLACKBOX_PARTITIONS": str(settings.partitions),
    }


def test_consume_command_stops_when_idle(
    consumer_settings: Settings, views_engine: Engine, producer: Any
) -> None:
    run_id = new_run_id()
    ends = producer(encoded(run_events(run_id, 7, "succeeded")))

    result = CliRunner(env=_cli_env(consumer_settings)).invoke(
        consume_command, ["--until-idle", "2"]
    )

    assert result.exit_code == 0, result.output
    assert "9 messages: 9 events inserted" in result.output
    assert stored_offsets(views_engine, consumer_settings) == ends


def test_consume_command_finishes_cleanly_on_sigterm(
    consumer_settings: Settings, views_engine: Engine, producer: Any
) -> None:
    run_id = new_run_id()
    ends = producer(encoded(run_events(run_id, 10, "succeeded")))
    command = "from agent_blackbox.cli.commands.views import consume_command; consume_command()"
    process = subprocess.Popen(
        [sys.executable, "-c", command],
        env={**_cli_env(consumer_settings), "PYTHONPATH": os.getcwd()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        drive_until(
            caught_up(views_engine, consumer_settings, ends),
            60,
            step=lambda: _still_running(process),
        )
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "12 messages: 12 events inserted" in stdout


def _still_running(process: subprocess.Popen[str]) -> None:
    try:
        process.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
        return
    raise AssertionError(f"consume exited early: {process.communicate()}")


def test_offsets_unreadable_at_assignment_apply_nothing_until_rewound(
    consumer_settings: Settings, views_engine: Engine, producer: Any
) -> None:
    import psycopg

    database_url = _url(views_engine)
    refusals = [1, 1]  # the first two connections fail, as a restarting database would

    def connect() -> psycopg.Connection[Any]:
        if refusals:
            refusals.pop()
            raise psycopg.OperationalError("connection refused (simulated)")
        return psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql"))

    flaky = create_engine("postgresql+psycopg://", creator=connect)
    run_id = new_run_id()
    ends = producer(encoded(run_events(run_id, 30, "succeeded")))
    consumer = ViewConsumer(consumer_settings, engine=flaky, registry=CollectorRegistry())
    failures: list[Exception] = []

    def step() -> None:
        try:
            consumer.poll_once(0.3)
        except ViewStoreUnavailable as exc:
            failures.append(exc)

    try:
        drive_until(caught_up(views_engine, consumer_settings, ends), 60, step=step)
    finally:
        consumer.close()
        flaky.dispose()
    assert not refusals
    assert len(failures) == 1  # the rewind's read; the assignment's read failed inside
    assert run_row(views_engine, run_id).event_count == 32
    assert count_events(views_engine, [run_id]) == 32


def test_an_offset_another_consumer_moved_fails_the_advance_and_names_it(
    views_engine: Engine,
) -> None:
    group = f"test-offsets-{uuid.uuid4().hex[:12]}"
    with views_engine.begin() as conn:
        advance_offsets(conn, group_id=group, moves=[OffsetMove("t", p, None, 10) for p in (0, 1)])
    # Partition 1 was advanced by someone else in between: the batch's advance of both
    # (one round trip) must fail on it and leave nothing changed.
    with views_engine.begin() as conn:
        advance_offsets(conn, group_id=group, moves=[OffsetMove("t", 1, 10, 15)])
    moves = [OffsetMove("t", 0, 10, 20, {3: 7}), OffsetMove("t", 1, 10, 20)]
    with pytest.raises(OffsetsMoved) as raised, views_engine.begin() as conn:
        advance_offsets(conn, group_id=group, moves=moves)
    assert raised.value.move.partition == 1
    with pytest.raises(OffsetsMoved) as raised, views_engine.begin() as conn:
        advance_offsets(conn, group_id=group, moves=[OffsetMove("t", 0, None, 30)])
    assert raised.value.move.partition == 0
    with views_engine.connect() as conn:
        stored = load_offsets(conn, group_id=group, partitions=[("t", 0), ("t", 1)])
        fences = load_fences(conn, group_id=group, partitions=[("t", 0)])
    assert stored == {("t", 0): 10, ("t", 1): 15}
    assert fences == {("t", 0): {}}
    with views_engine.begin() as conn:
        moves = [OffsetMove("t", 0, 10, 20, {3: 7}), OffsetMove("t", 1, 15, 25)]
        advance_offsets(conn, group_id=group, moves=moves)
        assert load_fences(conn, group_id=group, partitions=[("t", 0)]) == {("t", 0): {3: 7}}
        assert load_offsets(conn, group_id=group, partitions=[("t", 0), ("t", 1)]) == {
            ("t", 0): 20,
            ("t", 1): 25,
        }
        conn.execute(consumer_offsets.delete().where(consumer_offsets.c.group_id == group))
