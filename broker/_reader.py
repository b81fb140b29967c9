"""Bounded reads: stretches of partitions, read once from a start offset to an end.

Used by tools that read what is already written (a run's stretch for replay, the whole
topic for the deletion ledger) rather than follow the topic as a consumer group does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from agent_blackbox.broker._clients import new_consumer
from agent_blackbox.broker._errors import CHECK_BROKER, KafkaUnavailable, describe, kafka_errors
from agent_blackbox.schemas import Settings

PROBE_AFTER_S = 3.0
"""How long a bounded read waits without a message before it asks the broker for the
topic's metadata: an unreachable broker is then reported within seconds."""
PROBE_TIMEOUT_S = 5.0
"""How long that question waits for an answer."""

Ranges = Mapping[int, tuple[int, int]]
"""Partition → (first offset, end offset): the offsets from first up to, not including, end."""


def watermarks(
    settings: Settings, topic: str, *, timeout_s: float = 30.0
) -> dict[int, tuple[int, int]]:
    """Each partition of ``topic`` → (low, high) watermark: what is readable now.

    Raises:
        KafkaUnavailable: the broker does not answer, or the topic does not exist.
    """
    consumer = new_consumer(settings, group_id=_reader_group())
    try:
        with kafka_errors(f"cannot read the offsets of {topic}"):
            metadata = consumer.list_topics(topic, timeout=timeout_s)
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise KafkaUnavailable(
                    f"topic {topic} does not exist on {settings.kafka_bootstrap}; {CHECK_BROKER}"
                )
            deadline = time.monotonic() + timeout_s
            return {
                partition: _watermark(consumer, TopicPartition(topic, partition), deadline)
                for partition in sorted(found.partitions)
            }
    finally:
        consumer.close()


# The broker's answers while a new partition's leader is being elected; librdkafka does
# not mark every one of them retriable in an offsets answer.
_NO_LEADER_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)


def _watermark(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    # A topic created a moment ago can be listed before its leaders serve offsets: a
    # retriable refusal (no leader yet) is asked again until the deadline.
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                tp, timeout=max(0.1, deadline - time.monotonic())
            )
            return low, high
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (
                error.retriable() or error.code() in _NO_LEADER_YET
            )
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def read_ranges(
    settings: Settings,
    topic: str,
    ranges: Ranges,
    *,
    timeout_s: float = 60.0,
    batch: int = 500,
) -> Iterator[Message]:
    """The messages of each range, in offset order within a partition.

    A range ends early when its partition ends before it (the stretch was shorter than
    announced). Nothing is committed anywhere.

    Raises:
        KafkaUnavailable: the broker failed, or ``timeout_s`` passed without a message.
    """
    pending = {p: end for p, (first, end) in ranges.items() if end > first}
    if not pending:
        return
    position = {p: ranges[p][0] for p in pending}
    consumer = new_consumer(
        settings,
        group_id=_reader_group(),
        # The stretches are written already: a fetch that finds nothing new (past an
        # end) need not wait long for more.
        config={"enable.partition.eof": True, "fetch.wait.max.ms": 50},
    )
    try:
        with kafka_errors(f"cannot read {topic}"):
            consumer.assign([TopicPartition(topic, p, position[p]) for p in sorted(pending)])
        quiet_s = min(PROBE_AFTER_S, timeout_s)
        deadline = time.monotonic() + timeout_s
        probe_at = deadline - timeout_s + quiet_s
        while pending:
            # consume() returns once it holds the batch asked for, or at its timeout: ask
            # for no more than is still to read, so a short stretch does not wait it out.
            wanted = min(batch, sum(end - position[p] for p, end in pending.items()))
            with kafka_errors(f"cannot read {topic}"):
                messages = consumer.consume(max(wanted, 1), 0.1)
            if not messages:
                now = time.monotonic()
                if now > deadline:
                    raise KafkaUnavailable(
                        f"reading {topic} stalled for {timeout_s:.0f}s at {_where(position)}; "
                        f"{CHECK_BROKER}"
                    )
                if now > probe_at:
                    # Quiet for a while: a broker that is down says so now, not at the
                    # stall deadline (a consumer only retries a refused connection).
                    _probe(consumer, settings, topic)
                    probe_at = time.monotonic() + quiet_s
            for message in messages:
                partition = message.partition() or 0
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaUnavailable(f"reading {topic}[{partition}]: {describe(error)}")
                    pending.pop(partition, None)
                    continue
                if partition not in pending:
                    continue
                deadline = time.monotonic() + timeout_s
                probe_at = deadline - timeout_s + quiet_s
                position[partition] = (message.offset() or 0) + 1
                yield message
                if position[partition] >= pending[partition]:
                    pending.pop(partition, None)
    finally:
        consumer.close()


def _reader_group() -> str:
    # A group of its own: nothing is committed, and no other reader is disturbed.
    return f"blackbox-reader-{uuid.uuid4().hex}"


def _where(position: Mapping[int, int]) -> str:
    return ", ".join(f"[{p}]@{o}" for p, o in sorted(position.items()))


def _probe(consumer: Consumer, settings: Settings, topic: str) -> None:
    """Ask the broker for ``topic``'s metadata; raises KafkaUnavailable when it does not
    answer in :data:`PROBE_TIMEOUT_S`."""
    with kafka_errors(f"cannot reach Kafka at {settings.kafka_bootstrap} to read {topic}"):
        consumer.list_topics(topic, timeout=PROBE_TIMEOUT_S)
