"""Reading a topic back, and Kafka's own partitioner, for assertions."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from agent_blackbox.broker import murmur2, partition_of

__all__ = ["murmur2", "murmur2_partition", "read_topic"]
from agent_blackbox.schemas import Envelope, EnvelopeCodec


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for ``key``."""
    return partition_of(key, partitions)


def read_messages(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 60.0
) -> list[Message]:
    """Every message of ``topic`` in offset order per partition, at least ``expect``.

    Reads until ``expect`` messages arrived and the end of every partition is reached.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[Message] = []
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = list(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(out) < expect or len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise AssertionError(f"read {len(out)} of {expect} messages from {topic}")
            for msg in consumer.consume(1000, 0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        continue
                    raise AssertionError(f"consume error: {error}")
                at_end.discard(msg.partition())
                out.append(msg)
    finally:
        consumer.close()
    return out


def read_topic(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 60.0
) -> list[tuple[int, int, Envelope]]:
    """Every message of ``topic`` as (partition, offset, envelope), at least ``expect``."""
    codec = EnvelopeCodec()
    return [
        (m.partition(), m.offset(), codec.decode(m.value()))
        for m in read_messages(bootstrap, topic, expect=expect, timeout=timeout)
    ]
