"""Producers, consumers and admin clients, configured in one place."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from agent_blackbox.broker._errors import kafka_errors
from agent_blackbox.schemas import Settings

ClientConfig = Mapping[str, str | int | float | bool]
"""Extra librdkafka settings (security, tuning) merged into a client's configuration."""

LIBRDKAFKA_LOGGER = "agent_blackbox.broker.librdkafka"
"""Where the Kafka clients' own log lines go (unless a caller names another logger)."""


class RepeatFilter(logging.Filter):
    """Lets a line through once per ``every_s`` seconds per kind of line (its text with
    the numbers taken out), and says how many like it were held back meanwhile.

    librdkafka logs each failed connection attempt: while a broker is away that is
    hundreds of lines a minute, which bury everything else a process says.
    """

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = re.sub(r"\d+", "#", record.getMessage())
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(kind, (float("-inf"), 0))
            if now - last < self.every_s:
                self._seen[kind] = (last, held + 1)
                return False
            if len(self._seen) > 1_000:
                self._seen.clear()
            self._seen[kind] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} like it in the last {self.every_s:.0f} s)"
            record.args = None
        return True


def client_logger(logger: logging.Logger | None = None) -> logging.Logger:
    """``logger`` (by default :data:`LIBRDKAFKA_LOGGER`) with a :class:`RepeatFilter`."""
    chosen = logger or logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, RepeatFilter) for f in chosen.filters):
        chosen.addFilter(RepeatFilter())
    return chosen


def producer_config(
    settings: Settings, *, message_timeout_ms: int = 0, **overrides: Any
) -> dict[str, Any]:
    """The settings of a producer whose deliveries are the log (the relay's).

    The choices are what the ordering guarantee rests on: the idempotent producer keeps
    per-partition order across retries, ``acks=all`` makes an acknowledged event
    durable, and ``murmur2_random`` puts a run on the partition Java clients would.
    ``message_timeout_ms`` bounds how long a message may wait in the producer before it
    is failed (0: forever, an outage only delays delivery). The relay ties it to its
    lease, so that nothing it queued outlives the lease (see ``outbox.relay``); a failed
    delivery leaves its row in the outbox. ``linger.ms`` is 1: every partition's last
    request of a relay batch (a few hundred events, under ``batch.size``) waits for it,
    and so does each small batch of a nearly empty outbox, the commit-to-visible path.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "max.in.flight.requests.per.connection": 5,
        "message.timeout.ms": message_timeout_ms,
        "linger.ms": 1,
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


def new_producer(
    settings: Settings, config: ClientConfig | None = None, *, logger: logging.Logger | None = None
) -> Producer:
    """A producer for ``settings.kafka_bootstrap`` with ``config`` on top.

    Raises:
        KafkaUnavailable: the configuration is refused.
    """
    merged = {"bootstrap.servers": settings.kafka_bootstrap, **(config or {})}
    with kafka_errors("could not create a Kafka producer", hint="check the client settings"):
        return Producer(merged, logger=client_logger(logger))


def new_consumer(
    settings: Settings,
    *,
    group_id: str,
    config: ClientConfig | None = None,
    logger: logging.Logger | None = None,
) -> Consumer:
    """A consumer in ``group_id`` that commits nothing by itself (offsets are stored
    where the caller decides) and starts from the earliest offset.

    Its group session and heartbeat come from ``settings`` (a short session lets another
    member take over a dead consumer's partitions within seconds). A fetch is answered
    as soon as one byte is there, so an event is visible as soon as it is published;
    an idle fetch is held by the broker at most 100 ms, because a fetch in flight delays
    fetching a partition that was just assigned or rewound.

    Raises:
        KafkaUnavailable: the configuration is refused.
    """
    merged = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": settings.consumer_session_timeout_ms,
        # Several heartbeats must fit in a session, whichever of the two was shortened.
        "heartbeat.interval.ms": min(
            settings.consumer_heartbeat_ms, max(1, settings.consumer_session_timeout_ms // 3)
        ),
        "fetch.min.bytes": 1,
        "fetch.wait.max.ms": 100,
        **(config or {}),
    }
    with kafka_errors("could not create a Kafka consumer", hint="check the client settings"):
        return Consumer(merged, logger=client_logger(logger))


def new_admin(
    bootstrap: str, config: ClientConfig | None = None, *, logger: logging.Logger | None = None
) -> AdminClient:
    """An admin client for ``bootstrap``.

    Raises:
        KafkaUnavailable: the configuration is refused.
    """
    merged = {"bootstrap.servers": bootstrap, **(config or {})}
    with kafka_errors("could not create a Kafka admin client", hint="check the client settings"):
        return AdminClient(merged, logger=client_logger(logger))


def broker_answers(admin: AdminClient, *, timeout_s: float = 2.0) -> bool:
    """Whether a broker serves metadata and has registered itself."""
    try:
        return bool(admin.list_topics(timeout=timeout_s).brokers)
    except KafkaException:
        return False
