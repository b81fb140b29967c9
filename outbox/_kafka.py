"""The Kafka adapter of the write side: producer settings and topic creation."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from agent_blackbox.schemas import BlackboxError, Settings


class BrokerUnavailable(BlackboxError):
    """Kafka could not be reached or refused an administrative request."""


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """The relay's producer settings.

    The choices are what the ordering guarantee rests on: the idempotent producer keeps
    per-partition order across retries, ``acks=all`` makes an acknowledged event
    durable, ``murmur2_random`` puts a run on the partition Java clients would, and an
    unlimited message timeout means an outage only delays delivery, never fails it.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "max.in.flight.requests.per.connection": 5,
        "message.timeout.ms": 0,
        "linger.ms": 5,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 500_000,
        "compression.type": "lz4",
        "retry.backoff.ms": 100,
        "retry.backoff.max.ms": 2_000,
        "reconnect.backoff.max.ms": 2_000,
        "socket.connection.setup.timeout.ms": 5_000,
    }
    config.update(overrides)
    return config


def ensure_topic(
    settings: Settings,
    topic: str,
    *,
    partitions: int,
    timeout: float = 30.0,
) -> None:
    """Create ``topic`` if it is missing; an existing topic is left as it is.

    Raises:
        BrokerUnavailable: the broker did not answer within ``timeout`` seconds.
    """
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    deadline = time.monotonic() + timeout
    new = NewTopic(topic, num_partitions=partitions, replication_factor=settings.replication_factor)
    while True:
        remaining = deadline - time.monotonic()
        try:
            admin.create_topics([new], request_timeout=max(remaining, 1.0))[topic].result()
            return
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            if remaining <= 0 or (isinstance(error, KafkaError) and not error.retriable()):
                raise BrokerUnavailable(
                    f"could not create topic {topic} on {settings.kafka_bootstrap}: {error}; "
                    "check that Kafka runs (blackbox stack status) or BLACKBOX_KAFKA_BOOTSTRAP"
                ) from exc
        time.sleep(0.5)  # the broker is starting or electing a controller; ask again
