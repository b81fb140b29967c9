"""Reading a partition's watermarks while its leader is still being elected."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from agent_blackbox.broker._reader import _watermark


class _Consumer:
    """Refuses ``refusals`` times with ``code``, then answers (0, 42)."""

    def __init__(self, code: int, refusals: int) -> None:
        self.code, self.refusals, self.asked = code, refusals, 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        del tp, timeout
        self.asked += 1
        if self.asked <= self.refusals:
            raise KafkaException(KafkaError(self.code))
        return 0, 42


@pytest.mark.parametrize(
    "code", [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE]
)
def test_a_partition_without_a_leader_yet_is_asked_again(code: int) -> None:
    consumer = _Consumer(code, refusals=2)
    found = _watermark(consumer, TopicPartition("t", 0), time.monotonic() + 10)  # type: ignore[arg-type]
    assert found == (0, 42)
    assert consumer.asked == 3


def test_another_refusal_is_raised_at_once() -> None:
    consumer = _Consumer(KafkaError.TOPIC_AUTHORIZATION_FAILED, refusals=1)
    with pytest.raises(KafkaException):
        _watermark(consumer, TopicPartition("t", 0), time.monotonic() + 10)  # type: ignore[arg-type]
    assert consumer.asked == 1


def test_no_leader_past_the_deadline_is_raised() -> None:
    consumer = _Consumer(KafkaError.NOT_LEADER_FOR_PARTITION, refusals=10**6)
    with pytest.raises(KafkaException):
        _watermark(consumer, TopicPartition("t", 0), time.monotonic() + 0.3)  # type: ignore[arg-type]


def test_kafka_client_lines_are_let_through_once_a_minute_per_kind() -> None:
    import logging

    from agent_blackbox.broker._clients import RepeatFilter

    repeat = RepeatFilter(every_s=60)

    def line(text: str) -> logging.LogRecord:
        return logging.LogRecord("k", logging.ERROR, __file__, 1, text, None, None)

    first = line("Connect to ipv4#127.0.0.1:9 failed (after 1ms in state CONNECT)")
    assert repeat.filter(first)
    again = "Connect to ipv4#127.0.0.1:9 failed (after {}ms in state CONNECT)"
    held = [repeat.filter(line(again.format(n))) for n in (2, 3)]
    assert held == [False, False]  # the same kind of line, numbers aside
    assert repeat.filter(line("another kind of line"))
