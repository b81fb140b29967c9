"""The consumers under faults: stale relay copies, kill -9 and restart, --until-idle
during a rebalance, and members joining and leaving while events flow.

Consumers that are killed run as subprocesses of their own; the shared broker and
database are never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, ConsumerGroupState, Message, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, select

from agent_blackbox.broker import KafkaUnavailable, LeaseStamp, ensure_topics
from agent_blackbox.cli import main
from agent_blackbox.consumers import (
    BatchOutcome,
    CheckpointConsumer,
    ViewConsumer,
    ViewRunIndex,
    integrity_violations,
    load_checkpoint,
)
from agent_blackbox.consumers._errors import MemberFenced
from agent_blackbox.outbox import Recorder
from agent_blackbox.replayer import KafkaRunSource
from agent_blackbox.schemas import CheckpointSigner, Envelope, EnvelopeCodec, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._outbox import outbox_envelopes
from tests.integration._relays import grant_epoch
from tests.integration.test_consumers import (
    Offsets,
    caught_up,
    count_events,
    drive_until,
    new_run_id,
    run_events,
    run_row,
    stored_offsets,
)

pytestmark = pytest.mark.integration

CODEC = EnvelopeCodec()
SIGNER = CheckpointSigner.generate(key_id="fence-signer")
SHARD = 5


@pytest.fixture
def topic_settings(settings: Settings) -> Settings:
    suffix = uuid.uuid4().hex[:12]
    chosen = dataclasses.replace(
        settings,
        topic=f"{settings.topic}.faults",  # deleted with the test's topic
        consumer_group=f"test-faults-{suffix}",
        partitions=3,
    )
    ensure_topics(chosen)
    return chosen


class StampedProducer:
    """Produces envelopes keyed by run id, each stamped as a relay of ``SHARD`` would."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client = Producer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "acks": "all",
                "partitioner": "murmur2_random",
                "linger.ms": 5,
            }
        )
        self.ends: Offsets = {}

    def send(self, envelopes: list[Envelope], *, epoch: int, flush: bool = True) -> None:
        header: list[tuple[str, str | bytes | None]] = [LeaseStamp(SHARD, epoch).header()]
        for e in envelopes:
            self._client.produce(
                self._settings.topic,
                key=e.run_id.encode(),
                value=CODEC.encode(e),
                headers=header,
                on_delivery=self._delivered,
            )
            self._client.poll(0)
        if flush:
            self.flush()

    def flush(self) -> None:
        assert self._client.flush(30) == 0

    def _delivered(self, error: Any, message: Message) -> None:
        assert error is None, error
        tp = (message.topic() or "", message.partition() or 0)
        self.ends[tp] = max(self.ends.get(tp, 0), (message.offset() or 0) + 1)


def _drain(consumers: list[Any], done: Callable[[], bool], timeout: float = 60) -> BatchOutcome:
    total = BatchOutcome()

    def step() -> None:
        nonlocal total
        for consumer in consumers:
            total += consumer.poll_once(0.2) or BatchOutcome()

    drive_until(done, timeout, step=step)
    return total


def _signed_to(
    settings: Settings, engine: Engine, consumer: CheckpointConsumer
) -> Callable[..., bool]:
    group = dataclasses.replace(settings, consumer_group=consumer.group_id)
    return lambda ends: caught_up(engine, group, ends)()


def test_stale_copies_are_applied_neither_to_the_views_nor_by_the_signer(
    topic_settings: Settings, engine: Engine
) -> None:
    [run] = record_ticket_runs(Recorder(engine, settings=topic_settings), ticket_ids(1))
    events = outbox_envelopes(engine, run.run_id)
    assert events[-1].event_type == "run.finished"
    assert len(events) >= 4
    last = len(events)
    stamped = StampedProducer(topic_settings)
    grant_epoch(engine, SHARD, 2)
    # The first relay publishes two events; the lease moves on (epoch 2) and its
    # successor publishes up to the last but one; then the first relay wakes up and
    # its queued copies land: the run's end, and an event already published.
    stamped.send(events[:2], epoch=1)
    stamped.send(events[2 : last - 1], epoch=2)
    stamped.send([events[-1], events[1]], epoch=1)
    registry = CollectorRegistry()

    def consumers() -> tuple[ViewConsumer, CheckpointConsumer]:
        return (
            ViewConsumer(topic_settings, registry=registry),
            CheckpointConsumer(topic_settings, SIGNER, registry=registry),
        )

    views, signer = consumers()
    signed = _signed_to(topic_settings, engine, signer)
    try:
        applied = _drain(
            [views, signer],
            lambda: caught_up(engine, topic_settings, stamped.ends)() and signed(stamped.ends),
        )
    finally:
        views.close()
        signer.close()

    assert applied == BatchOutcome(inserted=2 * (last - 1), stale=4)
    row = run_row(engine, run.run_id)
    assert (row.status, row.event_count, row.last_sequence) == ("running", last - 1, last - 1)
    assert load_checkpoint(engine, run.run_id) is None  # run.finished was never chained
    labels = {"consumer": "views", "group": views.group_id, "topic": topic_settings.topic}
    assert registry.get_sample_value("blackbox_consumer_stale_dropped_total", labels) == 2

    # A restart (new consumers, same groups) judges with the fence stored beside the
    # offsets: another stale copy is dropped, the successor's copy of the end applied.
    stamped.send([events[-1]], epoch=1)
    stamped.send([events[-1]], epoch=2)
    views, signer = consumers()
    try:
        applied = _drain(
            [views, signer],
            lambda: caught_up(engine, topic_settings, stamped.ends)() and signed(stamped.ends),
        )
    finally:
        views.close()
        signer.close()
    assert applied == BatchOutcome(inserted=2, stale=2)
    row = run_row(engine, run.run_id)
    assert (row.status, row.event_count, row.last_sequence) == ("succeeded", last, last)
    checkpoint = load_checkpoint(engine, run.run_id)
    assert checkpoint is not None
    assert (checkpoint.last_sequence, checkpoint.finished) == (
        last,
        True,
    )
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(integrity_violations)).scalar() == 0


def test_a_stamp_of_an_epoch_no_relay_was_granted_hides_no_run(
    topic_settings: Settings, engine: Engine
) -> None:
    """Anyone who may produce to the topic can stamp a message with any epoch: junk, and
    a copy of a real event, stamped far past what the write side granted, move no fence,
    so the relay's real events after them are applied, now and after a restart."""
    [run] = record_ticket_runs(Recorder(engine, settings=topic_settings), ticket_ids(1))
    events = outbox_envelopes(engine, run.run_id)
    grant_epoch(engine, SHARD, 2)
    stamped = StampedProducer(topic_settings)
    stamped.send(events[:2], epoch=2)
    forger = Producer(  # the run's partition, as Java clients and the relay pick it
        {"bootstrap.servers": topic_settings.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    forged = [LeaseStamp(SHARD, 999_999).header()]
    key = run.run_id.encode()
    forger.produce(topic_settings.topic, b"junk", key, headers=forged)
    forger.produce(topic_settings.topic, CODEC.encode(events[1]), key, headers=forged)
    assert forger.flush(30) == 0
    stamped.send(events[2:], epoch=2)

    def drained() -> BatchOutcome:
        views = ViewConsumer(topic_settings, registry=CollectorRegistry())
        try:
            return _drain([views], caught_up(engine, topic_settings, stamped.ends))
        finally:
            views.close()

    outcome = drained()
    assert (outcome.inserted, outcome.stale) == (len(events), 0)
    row = run_row(engine, run.run_id)
    assert (row.status, row.event_count) == ("succeeded", len(events))
    # A run read back for replay or verify passes the forged stamp too.
    source = KafkaRunSource(topic_settings, ViewRunIndex(engine), run.run_id)
    assert [e.sequence for e in source] == [e.sequence for e in events]
    assert (source.fence.dropped, source.fence.unproven) == (0, 2)
    # And so does replay --all's scan of the whole topic.
    env = {
        "BLACKBOX_DATABASE_URL": topic_settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": topic_settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": topic_settings.topic,
        "BLACKBOX_PARTITIONS": str(topic_settings.partitions),
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }
    entry = "ticket-agent=agent_blackbox.examples.ticket_agent:replay_entry"
    args = ["replay", "--all", "--json", "--purpose", "a fencing test", "--agent", entry]
    replayed = CliRunner(env=env).invoke(main, args)
    assert replayed.exit_code == 0, replayed.output
    [line] = [json.loads(x) for x in replayed.stdout.splitlines() if '"type": "run"' in x]
    assert (line["run_id"], line["result"]) == (run.run_id, "PASS")
    # The fence stored beside the offsets holds no forged epoch: after a restart, the
    # real relay's next copy is still read as live (a duplicate, not a stale copy).
    stamped.send([events[-1]], epoch=2)
    assert drained().stale == 0


# -- consume as a process ------------------------------------------------------------------


def _env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
        "BLACKBOX_PARTITIONS": str(settings.partitions),
        "PYTHONPATH": os.getcwd(),
    }


_CONSUME = "from agent_blackbox.cli.commands.views import consume_command; consume_command()"


def _consume(settings: Settings, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CONSUME, *args],
        env=_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate()


def _alive(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        raise AssertionError(f"consume exited early: {process.communicate()}")
    time.sleep(0.1)  # polling interval of the deadline loop, not synchronisation


def _produce_runs(stamped: StampedProducer, runs: int, middle: int) -> int:
    envelopes = [e for _ in range(runs) for e in run_events(new_run_id(), middle, "succeeded")]
    stamped.send(envelopes, epoch=1)
    return len(envelopes)


def test_a_consumer_killed_and_started_again_resumes_its_partitions(
    topic_settings: Settings, engine: Engine
) -> None:
    stamped = StampedProducer(topic_settings)
    _produce_runs(stamped, 6, 10)
    member = f"views-{uuid.uuid4().hex[:6]}"
    first = _consume(topic_settings, "--instance-id", member)
    try:
        drive_until(caught_up(engine, topic_settings, stamped.ends), 60, step=lambda: _alive(first))
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        _stop(first)
    produced = _produce_runs(stamped, 6, 10)
    second = _consume(topic_settings, "--instance-id", member)
    try:
        # Generous: the figure (a few seconds) is bench/consumer_resume.py's.
        drive_until(
            caught_up(engine, topic_settings, stamped.ends), 30, step=lambda: _alive(second)
        )
        second.send_signal(signal.SIGTERM)
        stdout, stderr = second.communicate(timeout=30)
    finally:
        _stop(second)
    assert second.returncode == 0, stderr
    assert f"{produced} messages: {produced} events inserted" in stdout
    assert stored_offsets(engine, topic_settings) == stamped.ends


def _group_state(admin: AdminClient, group: str) -> Any:
    return admin.describe_consumer_groups([group])[group].result(timeout=10).state


def test_until_idle_waits_out_a_rebalance_and_drains_before_it_stops(
    topic_settings: Settings, engine: Engine
) -> None:
    stamped = StampedProducer(topic_settings)
    produced = _produce_runs(stamped, 8, 6)
    # Another member holds every partition and is slow to give them up: it serves no
    # rebalance until it is closed, so the group stays in rebalance meanwhile.
    held: list[Any] = []
    holder = Consumer(
        {
            "bootstrap.servers": topic_settings.kafka_bootstrap,
            "group.id": topic_settings.consumer_group,
            "partition.assignment.strategy": "range",
            "enable.auto.commit": False,
        }
    )
    holder.subscribe([topic_settings.topic], on_assign=lambda _c, ps: held.extend(ps))
    admin = AdminClient({"bootstrap.servers": topic_settings.kafka_bootstrap})
    group = topic_settings.consumer_group
    process: subprocess.Popen[str] | None = None
    try:
        drive_until(
            lambda: len(held) == topic_settings.partitions, 30, step=lambda: holder.poll(0.2)
        )
        process = _consume(topic_settings, "--until-idle", "0.5", "--instance-id", "")
        drive_until(
            lambda: _group_state(admin, group) == ConsumerGroupState.PREPARING_REBALANCING,
            30,
            step=lambda: _alive(process),
        )
        # Far longer than --until-idle: a consumer counting idle time before it holds
        # a partition would have stopped with "0 messages" by now.
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=3)
        holder.close()
        stdout, stderr = process.communicate(timeout=60)
    finally:
        holder.close()
        if process is not None:
            _stop(process)
    assert process.returncode == 0, stderr
    assert f"{produced} messages: {produced} events inserted" in stdout
    assert "read to their end" in stderr
    assert stored_offsets(engine, topic_settings) == stamped.ends


class Churn:
    """Members of one group: a new one joins, or the oldest leaves, every few seconds."""

    def __init__(self, settings: Settings, *, every_s: float, most: int) -> None:
        self._settings = settings
        self._every_s = every_s
        self._most = most
        self._registry = CollectorRegistry()
        self.members: list[ViewConsumer] = []
        self.total = BatchOutcome()
        self.changes = 0
        self.worked: set[int] = set()
        self._joining = True
        self._next = time.monotonic()
        self.join()

    def join(self) -> None:
        self.members.append(ViewConsumer(self._settings, batch_size=200, registry=self._registry))

    def step(self, *, churn: bool) -> None:
        """Poll every member once; change the membership when it is time."""
        for member in self.members:
            outcome = member.poll_once(0.05) or BatchOutcome()
            self.total += outcome
            if outcome.inserted:
                self.worked.add(id(member))
        if not churn or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._every_s
        self.changes += 1
        if len(self.members) == 1 or (self._joining and len(self.members) < self._most):
            self.join()
        else:
            self.members.pop(0).close()
        self._joining = len(self.members) < self._most if self._joining else len(self.members) == 1

    def close(self) -> None:
        for member in self.members:
            member.close()


def test_views_stay_exact_while_members_join_and_leave_under_load(
    settings: Settings, engine: Engine
) -> None:
    suffix = uuid.uuid4().hex[:12]
    chosen = dataclasses.replace(
        settings,
        topic=f"{settings.topic}.churn",
        consumer_group=f"test-churn-{suffix}",
        partitions=6,
    )
    ensure_topics(chosen)
    runs = {
        run_id: run_events(run_id, 40, "succeeded") for run_id in (new_run_id() for _ in range(50))
    }
    waves = [[events[i] for events in runs.values()] for i in range(42)]
    expected = sum(len(wave) for wave in waves)
    stamped = StampedProducer(chosen)
    churn = Churn(chosen, every_s=2.0, most=3)
    try:
        # One wave (an event of every run, in sequence order) every 0.3 s: ~13 s of flow.
        next_wave = time.monotonic()
        while waves:
            if time.monotonic() >= next_wave:
                stamped.send(waves.pop(0), epoch=1, flush=False)
                next_wave += 0.3
            churn.step(churn=True)
        stamped.flush()
        drive_until(
            caught_up(engine, chosen, stamped.ends), 40, step=lambda: churn.step(churn=False)
        )
    finally:
        churn.close()

    assert churn.changes >= 5
    assert len(churn.worked) >= 3  # the work really moved between members
    assert churn.total.inserted == expected
    assert count_events(engine, list(runs)) == expected
    for run_id in runs:
        row = run_row(engine, run_id)
        assert (row.status, row.event_count, row.last_sequence) == ("succeeded", 42, 42)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(integrity_violations)).scalar() == 0


def test_two_consumers_with_one_instance_id_stop_with_a_clear_error(
    topic_settings: Settings,
) -> None:
    first = ViewConsumer(topic_settings, registry=CollectorRegistry(), instance_id="same")
    second = ViewConsumer(topic_settings, registry=CollectorRegistry(), instance_id="same")
    failures: list[KafkaUnavailable] = []

    def step() -> None:
        for consumer in (first, second):
            try:
                consumer.poll_once(0.2)
            except KafkaUnavailable as exc:
                failures.append(exc)

    def for_good() -> list[KafkaUnavailable]:
        return [f for f in failures if not isinstance(f, MemberFenced)]

    try:
        drive_until(lambda: bool(for_good()), 120, step=step)
    finally:
        first.close()
        second.close()
    # Each fencing of the other made the fenced one join again, a few times, before one
    # of them said why it cannot go on.
    assert any(isinstance(f, MemberFenced) for f in failures)
    assert "give each its own (--instance-id)" in str(for_good()[0])
