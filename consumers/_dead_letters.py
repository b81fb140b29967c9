"""The dead-letter topic: where messages that cannot be projected go, with the reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message

from agent_blackbox.broker import ClientConfig, new_producer
from agent_blackbox.consumers._errors import DeadLetterFailed
from agent_blackbox.schemas import Settings

DLQ_REASON = "blackbox.dlq.reason"
DLQ_TOPIC = "blackbox.dlq.topic"
DLQ_PARTITION = "blackbox.dlq.partition"
DLQ_OFFSET = "blackbox.dlq.offset"

_DeliveryCallback = Callable[[KafkaError | None, Message], None]


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
        durable: ClientConfig = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
        self._producer = new_producer(settings, {**durable, **(client_config or {})})

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
