"""The relay keeps every run's order on the topic whatever mix of deliveries fails.

The publisher runs against a scripted producer: the test decides which delivery report
comes back when and with what outcome, and which messages the "broker" wrote (a message
reported failed may have been written all the same). What the broker wrote, in order, is
the topic; each run's first copies in it must be in sequence order.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError

from agent_blackbox.outbox.relay import _publisher
from agent_blackbox.outbox.relay._batch import Batch, Row
from agent_blackbox.outbox.relay._lease import LeaseDeadline, LeaseTiming
from agent_blackbox.outbox.relay._publisher import Publisher
from agent_blackbox.schemas import Settings

TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)

Outcome = Callable[[bytes], tuple[KafkaError | None, bool]]
"""A message's value → (its report's error, whether the broker wrote it)."""


@dataclass
class _Message:
    """A delivery report's message: key and value, as librdkafka gives them."""

    _key: bytes
    _value: bytes

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value


@dataclass
class ScriptedProducer:
    """Holds what is produced until ``poll`` reports it; ``pick`` chooses which of the
    messages held are reported at a poll (all, in order, by default)."""

    outcome: Outcome
    pick: Callable[[list[Any]], list[Any]] = lambda held: list(held)
    held: list[tuple[bytes, bytes, Callable[..., None]]] = field(default_factory=list)
    produced: list[bytes] = field(default_factory=list)
    topic: list[tuple[bytes, bytes]] = field(default_factory=list)

    def produce(
        self, topic: str, value: bytes, key: bytes, *, on_delivery: Any, headers: Any
    ) -> None:
        self.produced.append(value)
        self.held.append((key, value, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        chosen = self.pick(self.held)
        for message in chosen:
            self.held.remove(message)
        for key, value, report in chosen:
            err, written = self.outcome(value)
            if written:
                self.topic.append((key, value))
            report(err, _Message(key, value))
        return len(chosen)

    def __len__(self) -> int:
        return len(self.held)

    def purge(self, **_: Any) -> None:
        raise AssertionError("not expected")

    def close(self) -> None:
        pass


class _Leases:
    """A lease on shard 0, valid for a minute from now (until ``lapse``)."""

    def __init__(self, timing: LeaseTiming) -> None:
        self.deadline = LeaseDeadline(timing)
        self.deadline.renewed(time.monotonic())

    @property
    def stamps(self) -> Mapping[int, tuple[str, bytes]]:
        return {0: ("blackbox.lease", b"0:1")}


def _publisher_with(
    monkeypatch: pytest.MonkeyPatch, producer: ScriptedProducer
) -> tuple[Publisher, _Leases]:
    monkeypatch.setattr(_publisher, "new_producer", lambda *_, **__: producer)
    timing = LeaseTiming.for_ttl(60.0)
    publisher = Publisher(
        Settings(kafka_bootstrap="unused:9092"), timing=timing, overrides={}, shutdown_grace_s=1
    )
    return publisher, _Leases(timing)


def _row(row_id: int, run: str, sequence: int) -> Row:
    value = f"{run}/{sequence}".encode()
    return (row_id, run.encode(), b"event-%d" % row_id, value, 0.0, 0, 0)


def _settle(publisher: Publisher) -> list[Batch]:
    return publisher.settle(None, keep=0, waiting=lambda: None)


def _first_copies(topic: list[tuple[bytes, bytes]]) -> dict[str, list[int]]:
    """Run → sequences of its first copies, in topic order."""
    seen: set[bytes] = set()
    runs: dict[str, list[int]] = {}
    for _, value in topic:
        if value not in seen:
            seen.add(value)
            run, sequence = value.decode().split("/")
            runs.setdefault(run, []).append(int(sequence))
    return runs


def test_a_failed_delivery_holds_back_its_runs_later_events_and_they_follow_it_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing = {b"a/2"}
    producer = ScriptedProducer(
        outcome=lambda v: (TIMED_OUT, False) if v in failing else (None, True),
        pick=lambda held: [],  # no report until the test settles
    )
    publisher, leases = _publisher_with(monkeypatch, producer)
    rows = [_row(1, "a", 1), _row(2, "b", 1), _row(3, "a", 2), _row(4, "b", 2)]
    rows += [_row(5, "a", 3), _row(6, "b", 3)]
    # Only each run's first event goes out: the later ones wait for its acknowledgement.
    batch = publisher.publish(rows, leases)
    assert producer.produced == [b"a/1", b"b/1"]
    assert (batch.produced, batch.pending) == (6, 6)

    producer.pick = lambda held: list(held)
    (settled,) = _settle(publisher)
    # a/2 timed out: a/3 was never produced; run b went on.
    assert producer.produced == [b"a/1", b"b/1", b"a/2", b"b/2", b"b/3"]
    assert (settled.acked, settled.failed, settled.left) == ([1, 2, 4, 6], [3], [5])
    assert settled.left_rows

    # The next read starts from the lowest id: a/2 and a/3, now delivered, in order.
    failing.clear()
    publisher.publish([_row(3, "a", 2), _row(5, "a", 3)], leases)
    (again,) = _settle(publisher)
    assert again.acked == [3, 5]
    assert _first_copies(producer.topic) == {"a": [1, 2, 3], "b": [1, 2, 3]}


def test_a_run_stopped_in_one_batch_is_not_produced_from_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = ScriptedProducer(
        outcome=lambda v: (TIMED_OUT, False) if v == b"a/1" else (None, True),
        pick=lambda held: [],  # nothing reported until the test polls by settling
    )
    publisher, leases = _publisher_with(monkeypatch, producer)
    publisher.publish([_row(1, "a", 1), _row(2, "b", 1)], leases)
    second = publisher.publish([_row(3, "a", 2), _row(4, "b", 2)], leases)  # pipelined
    assert producer.produced == [b"a/1", b"b/1"]
    producer.pick = lambda held: list(held)
    first, second_settled = _settle(publisher)
    assert second_settled is second
    assert (first.acked, first.failed) == ([2], [1])
    assert (second.acked, second.left) == ([4], [3])
    assert b"a/2" not in producer.produced


def test_a_held_event_whose_turn_comes_after_the_lease_allows_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = ScriptedProducer(outcome=lambda v: (None, True), pick=lambda held: [])
    publisher, leases = _publisher_with(monkeypatch, producer)
    publisher.publish([_row(1, "a", 1), _row(2, "a", 2), _row(3, "a", 3)], leases)
    leases.deadline.lapse()  # fenced meanwhile: nothing more may be produced
    producer.pick = lambda held: list(held)
    (batch,) = _settle(publisher)
    assert producer.produced == [b"a/1"]
    assert (batch.acked, batch.left) == ([1], [2, 3])


@pytest.mark.parametrize("seed", range(40))
def test_first_copies_stay_in_order_whatever_fails_and_whenever_reports_come(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random runs, random failures (some written all the same), reports in random
    order and random numbers at a time, two batches in flight: the relay's loop of read
    from the lowest id, publish, settle, delete, until the outbox is empty."""
    rng = random.Random(seed)

    def outcome(value: bytes) -> tuple[KafkaError | None, bool]:
        if rng.random() < 0.25:
            return TIMED_OUT, rng.random() < 0.5  # possibly written though reported failed
        return None, True

    def pick(held: list[Any]) -> list[Any]:
        return rng.sample(held, rng.randint(0, len(held)))

    producer = ScriptedProducer(outcome=outcome, pick=pick)
    publisher, leases = _publisher_with(monkeypatch, producer)
    runs = [f"run{n}" for n in range(rng.randint(1, 6))]
    sequences = dict.fromkeys(runs, 0)
    outbox: list[Row] = []
    for row_id in range(1, rng.randint(10, 60)):
        run = rng.choice(runs)
        sequences[run] += 1
        outbox.append(_row(row_id, run, sequences[run]))
    for _ in range(500):
        if not outbox:
            break
        size = rng.randint(1, 8)
        first, second = outbox[:size], outbox[size : 2 * size]
        publisher.publish(first, leases)
        if second:
            publisher.publish(second, leases)
        acked = {row_id for batch in _settle(publisher) for row_id in batch.acked}
        outbox = [row for row in outbox if row[0] not in acked]
    assert not outbox, "the outbox did not drain"
    expected = {run: list(range(1, count + 1)) for run, count in sequences.items() if count}
    assert _first_copies(producer.topic) == expected


PURGED = KafkaError(KafkaError._PURGE_QUEUE)


@dataclass
class FreezingProducer(ScriptedProducer):
    """A scripted producer in a process that stands still for ``freeze_s`` just before
    its ``freeze_at``-th produce (the clock jumps; nothing else happens meanwhile), and
    whose ``purge`` fails what it holds, as librdkafka reports purged messages."""

    clock: list[float] = field(default_factory=lambda: [0.0])
    freeze_at: int = 0
    freeze_s: float = 0.0
    purges: int = 0

    def produce(
        self, topic: str, value: bytes, key: bytes, *, on_delivery: Any, headers: Any
    ) -> None:
        if len(self.produced) + 1 == self.freeze_at:
            self.clock[0] += self.freeze_s
        super().produce(topic, value, key, on_delivery=on_delivery, headers=headers)

    def purge(self, **_: Any) -> None:
        self.purges += 1
        held, self.held = self.held, []
        for key, value, report in held:
            report(PURGED, _Message(key, value))


def _frozen(
    monkeypatch: pytest.MonkeyPatch, producer: FreezingProducer
) -> tuple[Publisher, _Leases]:
    monkeypatch.setattr(_publisher, "time", _FakeTime(producer.clock))
    publisher, leases = _publisher_with(monkeypatch, producer)
    leases.deadline.renewed(producer.clock[0])  # TTL 60 s: produce until 24 s
    return publisher, leases


@dataclass
class _FakeTime:
    now: list[float]

    def monotonic(self) -> float:
        return self.now[0]


@pytest.mark.parametrize("freeze_s", [30.0, 5.0])
def test_a_message_produced_after_a_freeze_past_the_lease_is_purged_before_it_is_sent(
    monkeypatch: pytest.MonkeyPatch, freeze_s: float
) -> None:
    """A freeze between the lease check and the produce starts the message's timeout
    late: past the lease's last moment to produce, what is queued is purged at once and
    the batch cut; a shorter freeze changes nothing."""
    producer = FreezingProducer(
        outcome=lambda v: (None, True), pick=lambda held: [], freeze_at=2, freeze_s=freeze_s
    )
    publisher, leases = _frozen(monkeypatch, producer)
    rows = [_row(1, "a", 1), _row(2, "b", 1), _row(3, "c", 1)]
    batch = publisher.publish(rows, leases)
    producer.pick = lambda held: list(held)
    (settled,) = _settle(publisher)
    if freeze_s == 30.0:
        assert producer.purges == 1
        assert producer.produced == [b"a/1", b"b/1"]  # nothing after the freeze
        assert batch.cut
        assert settled.left_rows
        assert (settled.acked, settled.failed) == ([], [1, 2])
        assert producer.topic == []
    else:
        assert producer.purges == 0
        assert settled.acked == [1, 2, 3]


def test_a_held_event_produced_after_a_freeze_past_the_lease_is_purged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same rule for a run's next event, produced when its previous one was
    acknowledged: the freeze comes just before that produce."""
    producer = FreezingProducer(
        outcome=lambda v: (None, True), pick=lambda held: [], freeze_at=2, freeze_s=30.0
    )
    publisher, leases = _frozen(monkeypatch, producer)
    publisher.publish([_row(1, "a", 1), _row(2, "a", 2), _row(3, "a", 3)], leases)
    producer.pick = lambda held: list(held)
    (settled,) = _settle(publisher)
    assert producer.purges == 1
    assert producer.produced == [b"a/1", b"a/2"]
    assert (settled.acked, settled.failed, settled.left) == ([1], [2], [3])
    assert _first_copies(producer.topic) == {"a": [1]}
