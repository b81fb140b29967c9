"""Where a keyed message lands: the partition the relay's producer puts a run on.

The relay produces with key = run id and the ``murmur2_random`` partitioner, which
for a keyed message is Kafka's default: the positive murmur2 hash of the key modulo
the topic's partition count. Readers use the same function to know which partition a
run's events must be on; an event of the run found on another partition was not
produced by the relay.
"""

from __future__ import annotations

from agent_blackbox.broker._clients import new_admin
from agent_blackbox.broker._errors import CHECK_BROKER, KafkaUnavailable, kafka_errors
from agent_blackbox.schemas import Settings

_SEED, _M, _MASK = 0x9747B28C, 0x5BD1E995, 0xFFFFFFFF


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 hash of ``key``, as an unsigned 32-bit integer."""
    length = len(key)
    h = (_SEED ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(key[i : i + 4], "little") * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail, rest = length & ~3, length % 4
    if rest == 3:
        h ^= key[tail + 2] << 16
    if rest >= 2:
        h ^= key[tail + 1] << 8
    if rest >= 1:
        h = ((h ^ key[tail]) * _M) & _MASK
    h = ((h ^ (h >> 13)) * _M) & _MASK
    return h ^ (h >> 15)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def run_partition(run_id: str, partitions: int) -> int:
    """The partition the relay puts the events of ``run_id`` on."""
    return partition_of(run_id.encode("utf-8"), partitions)


def partition_count(settings: Settings, topic: str, *, timeout_s: float = 30.0) -> int:
    """How many partitions ``topic`` has now.

    Raises:
        KafkaUnavailable: the broker does not answer, or the topic does not exist.
    """
    admin = new_admin(settings.kafka_bootstrap)
    with kafka_errors(f"cannot read the partitions of {topic}"):
        found = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise KafkaUnavailable(
            f"topic {topic} does not exist on {settings.kafka_bootstrap}; {CHECK_BROKER}"
        )
    return len(found.partitions)
