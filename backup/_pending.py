"""What a backup writer has read since its last cut: each partition's messages for the
next segment, how far it read, and the ranges the topic dropped before they were read."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Message as KafkaMessage

from agent_blackbox.backup._manifest import LostRange
from agent_blackbox.backup._segment import Message, SegmentBuilder
from agent_blackbox.schemas import EnvelopeCodec


class PendingCut:
    """The next cut as it fills, between two cuts.

    Args:
        topic: the topic backed up.
        codec: decodes the envelopes (for what a segment's manifest entry says).
    """

    def __init__(self, topic: str, codec: EnvelopeCodec) -> None:
        self._topic = topic
        self._codec = codec
        self._builders: dict[int, SegmentBuilder] = {}
        self._since: float | None = None
        self.read: dict[int, int] = {}
        """Partition -> the next offset to read: the positions the cut records."""
        self.lost: list[LostRange] = []
        """Offsets the topic removed before they were read, since the last cut."""

    def resume(self, read: Mapping[int, int], lost: Iterable[LostRange]) -> None:
        """Start reading at ``read``, with ``lost`` already found missing."""
        self.read = dict(read)
        self.lost = list(lost)

    def expected(self, partition: int, offset: int) -> int:
        """The offset that should come next in ``partition`` (``offset`` when nothing
        was read there yet)."""
        return self.read.get(partition, offset)

    def add(self, message: KafkaMessage) -> None:
        """Buffer ``message`` for its partition's next segment."""
        partition = message.partition() or 0
        offset = message.offset() or 0
        builder = self._builders.get(partition)
        if builder is None:
            builder = self._builders[partition] = SegmentBuilder(
                self._topic, partition, self._codec
            )
        _kind, timestamp = message.timestamp()
        key, value = message.key(), message.value()
        builder.add(
            Message(
                offset=offset,
                timestamp_ms=timestamp,
                key=key.encode() if isinstance(key, str) else key,
                value=value.encode() if isinstance(value, str) else value,
                headers=_headers(message),
            )
        )
        self.read[partition] = offset + 1
        if self._since is None:
            self._since = time.monotonic()

    @property
    def size(self) -> int:
        """Bytes of messages buffered."""
        return sum(b.size for b in self._builders.values())

    def due(self, *, roll_bytes: int, roll_seconds: float) -> bool:
        """Whether ``roll_bytes`` are buffered or the oldest message waited
        ``roll_seconds``."""
        if self._since is None:
            return False
        waited = time.monotonic() - self._since
        return self.size >= roll_bytes or waited >= roll_seconds

    def segments(self) -> list[SegmentBuilder]:
        """The partitions' buffers that hold messages, in partition order."""
        return [b for _p, b in sorted(self._builders.items()) if b.messages]

    def written(self) -> None:
        """The cut was written: empty the buffers (the read positions stay)."""
        self._builders.clear()
        self.lost.clear()
        self._since = None

    def where(self) -> str:
        """The read positions, for a message."""
        return ", ".join(f"[{p}]@{o}" for p, o in sorted(self.read.items()))


def _headers(message: KafkaMessage) -> tuple[tuple[str, bytes | None], ...]:
    found: list[tuple[str, bytes | None]] = []
    for header in message.headers() or ():
        name, raw = header[0], header[1]  # the stubs type a header loosely
        found.append((str(name), raw.encode() if isinstance(raw, str) else raw))
    return tuple(found)
