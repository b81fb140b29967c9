"""The backup writer's reader of the events topic.

It joins no consumer group: one writer per store holds every partition, assigned by
hand at the offsets the backup resumes from (the store's group id only names the
client). It also tells a skip in the offsets that loses nothing from one where the
topic's retention removed messages before they were read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage

from agent_blackbox.backup._errors import BackupError
from agent_blackbox.backup._manifest import LostRange
from agent_blackbox.broker import kafka_errors, new_consumer
from agent_blackbox.schemas import Settings

# These are the writer's log lines: they keep its logger's name.
log = logging.getLogger("agent_blackbox.backup._writer")


class TopicReader:
    """Reads every partition of the topic for one backup writer.

    Args:
        settings: the broker and the topic.
        group_id: the client's group id (the store's backup group).
    """

    def __init__(self, settings: Settings, *, group_id: str) -> None:
        self._settings = settings
        self._topic = settings.topic
        self._group_id = group_id
        self._consumer: Consumer | None = None

    def open(self, positions: Mapping[int, int]) -> None:
        """Start reading each partition at ``positions`` (partition -> next offset).

        Raises:
            KafkaUnavailable: the client could not start or assign.
        """
        self._consumer = new_consumer(self._settings, group_id=self._group_id)
        with kafka_errors(f"cannot read {self._topic}"):
            self._consumer.assign(
                [TopicPartition(self._topic, p, o) for p, o in sorted(positions.items())]
            )

    def close(self) -> None:
        """Stop reading (nothing happens when it is not open)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def consume(self, batch: int, timeout: float) -> list[KafkaMessage]:
        """Up to ``batch`` messages, waiting at most ``timeout`` for the first; errors the
        client hands over as messages are logged and left out.

        Raises:
            BackupError: the reader is not open.
            KafkaUnavailable: the client failed.
        """
        consumer = self._require_consumer()
        with kafka_errors(f"cannot read {self._topic}"):
            messages = consumer.consume(batch, timeout)
        read: list[KafkaMessage] = []
        for message in messages:
            error = message.error()
            if error is None:
                read.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("backup: reading %s: %s", self._topic, error.str())
        return read

    def lost(self, partition: int, expected: int, offset: int) -> LostRange | None:
        """What the topic removed unread, when ``partition`` went on at ``offset``
        where ``expected`` was next; ``None`` when nothing was lost.

        Raises:
            KafkaUnavailable: the broker did not tell the partition's low watermark.
        """
        # Offsets also skip for a reason that loses nothing (transaction markers); only a
        # low watermark past what was expected means the topic dropped unread messages.
        consumer = self._require_consumer()
        with kafka_errors(f"cannot read the offsets of {self._topic}"):
            low, _high = consumer.get_watermark_offsets(
                TopicPartition(self._topic, partition), timeout=10
            )
        if low <= expected:
            return None
        end = min(low, offset)
        log.error(
            "backup: %s[%d] offsets %d..%d were removed by the topic's retention before "
            "they were backed up; raise the topic's retention or keep the backup running",
            self._topic,
            partition,
            expected,
            end - 1,
        )
        return LostRange(partition, expected, end)

    def ends(self, partitions: Iterable[int]) -> dict[int, int]:
        """The high watermark of each of ``partitions`` as of the last fetch (kept by
        the client: no request to the broker); those not known yet are left out."""
        consumer = self._require_consumer()
        found: dict[int, int] = {}
        for partition in partitions:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self._topic, partition), cached=True
            )
            if high >= 0:
                found[partition] = high
        return found

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise BackupError("the backup writer is not open; call open() first")
        return self._consumer
