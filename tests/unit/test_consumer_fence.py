"""The consumer runtime's fence, idle clock and group membership, without services."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent_blackbox.broker import EpochFence, GrantedEpochs, LeaseStamp
from agent_blackbox.cli._workers import membership
from agent_blackbox.consumers import BatchOutcome, ConsumerRuntime
from agent_blackbox.consumers._idle import IdleClock
from agent_blackbox.consumers._membership import host_member_id
from agent_blackbox.schemas import Settings

TOPIC = "events"


@dataclass
class FakeMessage:
    """What the runtime reads of a Kafka message."""

    partition_: int
    offset_: int
    stamp: LeaseStamp | None
    value_: bytes = b"not an envelope"

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes:
        return self.value_

    def key(self) -> bytes:
        return b"run-1"

    def headers(self) -> list[tuple[str, bytes]] | None:
        return None if self.stamp is None else [self.stamp.header()]


def _runtime(**kwargs: object) -> ConsumerRuntime:
    settings = Settings(topic=TOPIC)
    return ConsumerRuntime(
        settings,
        lambda _conn, _records: BatchOutcome(),
        name="fence-test",
        registry=CollectorRegistry(),
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_stale_copy_is_dropped_counted_and_its_offset_passed() -> None:
    runtime = _runtime()
    # The epochs the write side granted, as the consumer asks its database for them.
    runtime._assignment.fence = EpochFence(GrantedEpochs(lambda: {3: 2, 4: 1}))
    runtime._assignment.positions = {(TOPIC, 0): 0, (TOPIC, 1): 0}
    messages = [
        FakeMessage(0, 0, LeaseStamp(3, 2)),
        FakeMessage(0, 1, LeaseStamp(3, 1)),  # older epoch of the same shard: stale
        FakeMessage(0, 2, LeaseStamp(4, 1)),  # another shard: judged apart
        FakeMessage(1, 0, LeaseStamp(3, 1)),  # another partition: judged apart
        FakeMessage(0, 3, None),  # unstamped: never fenced
    ]

    batch = runtime._sort(messages)  # type: ignore[arg-type]

    assert batch.stale == 1
    assert runtime.stale_dropped == 1
    # Everything else reached decoding (here: dead-lettered as not an envelope).
    assert [p.offset for p in batch.poison] == [0, 2, 0, 3]
    assert batch.next_offsets == {(TOPIC, 0): 4, (TOPIC, 1): 1}
    assert runtime._assignment.fence.state(0) == {3: 2, 4: 1}


def test_a_message_of_a_partition_not_held_is_not_judged() -> None:
    runtime = _runtime()
    runtime._assignment.positions = {(TOPIC, 0): 5}
    batch = runtime._sort([FakeMessage(0, 4, LeaseStamp(3, 9)), FakeMessage(1, 0, None)])  # type: ignore[list-item]
    assert (batch.stale, batch.next_offsets, runtime._assignment.fence.state(0)) == (0, {}, {})


@dataclass
class FakeAssignee:
    name: str = "views"
    held: list[tuple[str, int]] = field(default_factory=list)
    behind: int | None = 0
    asked: int = 0

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return self.held

    def lag(self) -> int | None:
        self.asked += 1
        return self.behind


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_idle_time_counts_only_while_partitions_are_assigned() -> None:
    consumer, clock = FakeAssignee(), Clock()
    idle = IdleClock(consumer, 2.0, clock=clock)
    for clock.now in (0.0, 5.0, 50.0):
        assert not idle.finished()  # nothing assigned: waiting, however long
    consumer.held = [(TOPIC, 0)]
    clock.now = 51.0
    assert not idle.finished()  # the clock starts now
    clock.now = 52.5
    assert not idle.finished()
    clock.now = 53.0
    assert idle.finished()
    assert consumer.asked == 1


def test_known_or_unknown_lag_keeps_it_going() -> None:
    consumer, clock = FakeAssignee(held=[(TOPIC, 0)], behind=7), Clock()
    idle = IdleClock(consumer, 1.0, clock=clock)
    assert not idle.finished()
    clock.now = 1.0
    assert not idle.finished()  # 7 unread: a new idle spell starts
    consumer.behind = None
    clock.now = 2.0
    assert not idle.finished()  # the broker did not answer: not known to be done
    consumer.behind = 0
    clock.now = 2.5
    assert not idle.finished()
    idle.reset()  # a batch came
    clock.now = 3.5
    assert not idle.finished()
    clock.now = 4.5
    assert idle.finished()


def test_without_max_idle_it_never_finishes() -> None:
    consumer, clock = FakeAssignee(held=[(TOPIC, 0)]), Clock()
    idle = IdleClock(consumer, None, clock=clock)
    clock.now = 1e9
    assert not idle.finished()
    assert consumer.asked == 0


def test_each_consumer_process_on_a_host_gets_its_own_stable_id(tmp_path: Path) -> None:
    host = socket.gethostname()
    with host_member_id("views", "g", directory=tmp_path) as first:
        with host_member_id("views", "g", directory=tmp_path) as second:
            assert (first, second) == (f"views@{host}", f"views@{host}#2")
        with host_member_id("views", "g", directory=tmp_path) as again:
            assert again == f"views@{host}#2"  # the slot freed is taken again
        with host_member_id("views", "other", directory=tmp_path) as other_group:
            assert other_group == f"views@{host}"
    with host_member_id("views", "g", directory=tmp_path) as restarted:
        assert restarted == f"views@{host}"


def test_membership_takes_the_flag_then_the_variable_then_a_host_slot() -> None:
    with membership(Settings(), name="views", instance_id=None, session_timeout=None) as chosen:
        assert chosen.consumer_instance_id is not None
        assert chosen.consumer_instance_id.startswith(f"views@{socket.gethostname()}")
        assert chosen.consumer_session_timeout_ms == 6000
    from_env = Settings.from_env({"BLACKBOX_CONSUMER_INSTANCE_ID": "views-a"})
    with membership(from_env, name="views", instance_id=None, session_timeout=7.5) as chosen:
        assert (chosen.consumer_instance_id, chosen.consumer_session_timeout_ms) == (
            "views-a",
            7500,
        )
    with membership(from_env, name="views", instance_id="", session_timeout=None) as dynamic:
        runtime = ConsumerRuntime(
            dynamic, lambda _c, _r: BatchOutcome(), name="x", registry=CollectorRegistry()
        )
        assert "group.instance.id" not in runtime._member.config()
    assert "group.instance.id" not in _runtime()._member.config()
    assert _runtime(instance_id="views-b")._member.config()["group.instance.id"] == "views-b"
