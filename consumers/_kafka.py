"""The Kafka edge of the consumers: topic setup and the dead-letter writer.

Every ``confluent_kafka`` exception is translated here into a :mod:`consumers` error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # the class confluent_kafka.admin re-exports

from agent_blackbox.consumers._errors import DeadLetterFailed, KafkaUnavailable
from agent_blackbox.schemas import Settings

log = logging.getLogger(__name__)

ClientConfig = Mapping[str, str | int | float | bool]
"""Extra librdkafka settings (security, tuning) merged into every client's config."""

DLQ_REASON = "blackbox.dlq.reason"
DLQ_TOPIC = "blackbox.dlq.topic"
DLQ_PARTITION = "blackbox.dlq.partition"
DLQ_OFFSET = "blackbox.dlq.offset"
_MAX_DLQ_PARTITIONS = 3

_DeliveryCallback = Callable[[KafkaError | None, Message], None]


def ensure_topics(
    settings: Settings, *, client_config: ClientConfig | None = None, timeout_s: float = 30.0
) -> None:
    """Create the event topic and its dead-letter topic where they are missing.

    The event topic gets ``settings.partitions`` partitions, the dead-letter topic
    between 1 and 3; both ``settings.replication_factor``. A topic someone else
    created first is fine. Returns once the broker reports both topics with leaders.

    Raises:
        KafkaUnavailable: the broker is unreachable or refused to create a topic.
    """
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, **(client_config or {})})
    wanted = {
        settings.topic: settings.partitions,
        settings.dlq_topic: max(1, min(_MAX_DLQ_PARTITIONS, settings.partitions)),
    }
    deadline = time.monotonic() + timeout_s
    missing = [name for name in wanted if not _has_leaders(admin, name, deadline)]
    if missing:
        _create(admin, {name: wanted[name] for name in missing}, settings, deadline)
        _await_leaders(admin, missing, deadline)


def _create(
    admin: AdminClient, wanted: dict[str, int], settings: Settings, deadline: float
) -> None:
    topics = [
        NewTopic(name, num_partitions=partitions, replication_factor=settings.replication_factor)
        for name, partitions in wanted.items()
    ]
    for name, future in admin.create_topics(topics).items():
        try:
            future.result(timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaUnavailable(
                    f"could not create topic {name!r} on {settings.kafka_bootstrap}: "
                    f"{exc.args[0].str()}; create it by hand or fix the broker settings"
                ) from exc
        except TimeoutError as exc:  # concurrent.futures raises the builtin since 3.11
            raise KafkaUnavailable(
                f"topic {name!r} was not created in time on {settings.kafka_bootstrap}; "
                "check that the broker is up"
            ) from exc


def _has_leaders(admin: AdminClient, topic: str, deadline: float) -> bool:
    try:
        metadata = admin.list_topics(topic=topic, timeout=max(0.1, deadline - time.monotonic()))
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"cannot read topic metadata from the broker: {exc.args[0].str()}; "
            "check BLACKBOX_KAFKA_BOOTSTRAP and that the broker is up"
        ) from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return False
    return all(p.leader >= 0 for p in found.partitions.values())


def _await_leaders(admin: AdminClient, topics: Sequence[str], deadline: float) -> None:
    # A topic just created may take a moment to reach every broker's metadata.
    pause = threading.Event()
    for topic in topics:
        while not _has_leaders(admin, topic, deadline):
            if time.monotonic() >= deadline:
                raise KafkaUnavailable(
                    f"topic {topic!r} exists but has no leader yet; check the broker logs"
                )
            pause.wait(0.05)


@dataclass(frozen=True, slots=True)
class Poison:
    """A message that cannot be projected, and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    reason: str

    @classmethod
    def of(cls, message: Message, reason: str) -> Poison:
        """The poison record of a consumed ``message``."""
        raw_key = message.key()
        raw_value = message.value()
        return cls(
            topic=message.topic() or "",
            partition=message.partition() or 0,
            offset=message.offset() or 0,
            key=raw_key.encode() if isinstance(raw_key, str) else raw_key,
            value=raw_value.encode() if isinstance(raw_value, str) else raw_value,
            headers=_header_pairs(message),
            reason=reason,
        )

    def dlq_headers(self) -> list[tuple[str, str | bytes | None]]:
        """The original headers followed by the ``blackbox.dlq.*`` ones."""
        return [
            *self.headers,
            (DLQ_REASON, self.reason.encode()),
            (DLQ_TOPIC, self.topic.encode()),
            (DLQ_PARTITION, str(self.partition).encode()),
            (DLQ_OFFSET, str(self.offset).encode()),
        ]


def _header_pairs(message: Message) -> tuple[tuple[str, bytes], ...]:
    raw = message.headers() or ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((name, _as_bytes(value)) for name, value in pairs)


def _as_bytes(value: str | bytes | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


class DeadLetterWriter:
    """Writes poison messages to the dead-letter topic and waits for the broker's ack."""

    def __init__(
        self,
        settings: Settings,
        *,
        client_config: ClientConfig | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._topic = settings.dlq_topic
        self._timeout_s = timeout_s
        self._producer = Producer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                **(client_config or {}),
            }
        )

    def send(self, poison: Sequence[Poison]) -> None:
        """Produce every poison message and return only once all are acknowledged.

        Raises:
            DeadLetterFailed: a message was refused or not acknowledged in time.
        """
        if not poison:
            return
        failures: list[str] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failures.append(error.str())

        for item in poison:
            self._produce(item, delivered)
        remaining = self._producer.flush(self._timeout_s)
        if remaining or failures:
            raise DeadLetterFailed(
                f"{remaining + len(failures)} of {len(poison)} poison messages were not "
                f"acknowledged by {self._topic!r} ({'; '.join(failures) or 'timed out'}); "
                "their offsets stay uncommitted and the batch will be retried"
            )

    def _produce(self, item: Poison, delivered: _DeliveryCallback) -> None:
        try:
            self._producer.produce(
                self._topic,
                key=item.key,
                value=item.value,
                headers=item.dlq_headers(),
                on_delivery=delivered,
            )
        except (BufferError, KafkaException) as exc:
            raise DeadLetterFailed(
                f"could not queue poison message {item.topic}[{item.partition}]@{item.offset} "
                f"for {self._topic!r}: {exc}; the batch will be retried"
            ) from exc

    def close(self) -> None:
        """Deliver anything still queued (bounded by the timeout), then shut the client
        down (left to garbage collection, it goes on reconnecting after the broker is
        gone)."""
        self._producer.flush(self._timeout_s)
        self._producer.close()
