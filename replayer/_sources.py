"""Where recorded runs are read from: memory, an Avro archive, or Kafka (through a run
index).

Every source streams: a run is yielded event by event, so a run of a million events
replays in bounded memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from fastavro import parse_schema, reader, writer
from fastavro.read import SchemaResolutionError

from agent_blackbox.broker import EpochFence, KafkaUnavailable, read_ranges
from agent_blackbox.replayer._history import (
    SkippedMessage,
    message_headers,
    message_key,
    undecodable,
)
from agent_blackbox.replayer._index import RunIndex
from agent_blackbox.schemas import (
    ENVELOPE,
    BlackboxError,
    Envelope,
    EnvelopeCodec,
    Settings,
    default_registry,
)

log = logging.getLogger(__name__)


class SourceError(BlackboxError):
    """A recorded run could not be read from its source."""


def write_archive(path: Path, envelopes: Iterable[Envelope], *, codec: str = "deflate") -> int:
    """Write ``envelopes`` to an Avro object container file; returns how many.

    The file embeds the schema it was written with, so it stays readable by every later
    release: the envelope schema with its fields at their base Avro types (``event_id``
    as its UUID string, ``recorded_at`` as microseconds since the epoch, the form the
    chain hashes), which saves converting every value to a UUID and a datetime on read.
    """
    count = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal count
        for envelope in envelopes:
            count += 1
            record = envelope.to_record()
            record["recorded_at"] = envelope.recorded_at_us
            yield record

    with path.open("wb") as out:
        writer(out, _archive_schema(), records(), codec=codec)
    return count


def read_archive(path: Path, *, run_id: str | None = None) -> Iterator[Envelope]:
    """The envelopes of an archive (of one run when ``run_id`` is given), in file order.

    Reads archives of this release, archives written with the envelope schema itself
    (its logical types included), and archives of other envelope schema versions, which
    are resolved to this one record by record.

    Raises:
        SourceError: the file is missing or not an envelope archive.
    """
    ours = _archive_schema()
    try:
        with path.open("rb") as stream:
            records = reader(stream)
            written = records.writer_schema
            if written not in (_as_written(ours), _as_written(_envelope_schema())):
                # Another envelope schema: resolve each record to ours. Only then:
                # resolving a record costs about three times as much as reading it.
                stream.seek(0)
                records = reader(stream, ours)
            # The file's schema is an envelope schema: every record is an envelope.
            envelopes: Iterable[Any] = records
            if run_id is not None:
                envelopes = (r for r in envelopes if r["run_id"] == run_id)
            yield from map(Envelope.from_record, envelopes)
    except OSError as exc:
        raise SourceError(f"cannot read archive {path}: {exc.strerror}") from exc
    except (ValueError, EOFError, StopIteration, SchemaResolutionError) as exc:
        raise SourceError(f"{path} is not a readable envelope archive: {exc}") from exc


def _envelope_schema() -> Any:
    return default_registry().latest(ENVELOPE).parsed


@cache
def _archive_schema() -> Any:
    """The newest envelope schema without its logical types, parsed."""

    def plain(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: plain(v) for k, v in node.items() if k != "logicalType"}
        if isinstance(node, list):
            return [plain(item) for item in node]
        return node

    return parse_schema(plain(_as_written(_envelope_schema())))


def _as_written(parsed: Any) -> Any:
    """A schema as fastavro parsed it, without the bookkeeping keys parsing adds: the
    form in which a reader reports a file's writer schema."""
    return {key: value for key, value in parsed.items() if not key.startswith("__")}


class KafkaRunSource:
    """A run read back from the event topic, located through a run index.

    The index says which partition holds the run and between which offsets, so only
    that stretch of one partition is read, never the whole topic. A stale relay's
    copies are dropped by an :class:`~agent_blackbox.broker.EpochFence` (see
    :attr:`fence`), duplicates left by a relay crash are skipped (the first copy of
    each sequence wins), and a message under the run's key that is not one of its
    events is passed over and listed in :attr:`skipped`.

    Raises:
        SourceError: the index does not know the run.
    """

    def __init__(
        self, settings: Settings, index: RunIndex, run_id: str, *, timeout_s: float = 60.0
    ) -> None:
        self._settings = settings
        self.timeout_s = timeout_s
        self.run_id = run_id
        location = index.locate(run_id)
        if location is None:
            raise SourceError(
                f"run {run_id} is not in the events index this login can read: is the run id "
                "right (the whole id), have its events been relayed (blackbox relay) and "
                "indexed (blackbox consume), and is the run's tenant granted to this login?"
            )
        self.topic, self.partition = location.topic, location.partition
        self.first, self.last = location.first_offset, location.last_offset
        self.count = location.events
        self.agent_id: str | None = location.agent_id
        self.unverified = location.unverified
        """The sequences of the run's events the write side does not vouch for, as the
        index marks them (:meth:`vouched` leaves them out)."""
        self.skipped: list[SkippedMessage] = []
        """Messages under the run's key that are not its events: anyone who can produce
        to the topic can write one; the view consumer dead-letters or flags them, and a
        reader passes over them rather than stop at them."""
        self.fence = EpochFence(index.granted_epochs())
        """The fence of this read (moved only to epochs the write side granted):
        :attr:`EpochFence.dropped` counts stale copies."""

    def _skip(self, offset: int, why: str) -> None:
        self.skipped.append(SkippedMessage(self.partition, offset, why, self.run_id))
        log.debug(
            "run %s: passed over %s[%d]@%s under the run's key: %s",
            self.run_id,
            self.topic,
            self.partition,
            offset,
            why,
        )

    def vouched(self) -> Iterator[Envelope]:
        """The run's events but those the index marks unverified."""
        marked = self.unverified
        return iter(self) if not marked else (e for e in self if e.sequence not in marked)

    def __iter__(self) -> Iterator[Envelope]:
        last_sequence = 0
        for envelope in self.every_copy():
            if envelope.sequence > last_sequence:
                last_sequence = envelope.sequence
                yield envelope

    def every_copy(self) -> Iterator[Envelope]:
        """Every envelope of the run in the indexed stretch, in offset order, copies of
        one sequence included (a forged copy may come before the real one): for a
        reader that judges the copies by their chain."""
        codec = EnvelopeCodec()
        stretch = {self.partition: (self.first, self.last + 1)}
        messages = read_ranges(self._settings, self.topic, stretch, timeout_s=self.timeout_s)
        try:
            for message in messages:
                # Fenced before the key is looked at: the fence must see every message
                # of the partition in offset order to know its shards' newest epochs.
                if not self.fence.admit(self.partition, message_headers(message)):
                    continue
                if message_key(message) != self.run_id:
                    continue
                envelope, why = undecodable(message, codec)
                if envelope is None:
                    self._skip(message.offset() or 0, why)
                    continue
                if envelope.run_id != self.run_id:
                    self._skip(message.offset() or 0, f"an envelope of run {envelope.run_id!r}")
                    continue
                yield envelope
        except KafkaUnavailable as exc:
            raise SourceError(
                f"run {self.run_id}: cannot read {self.topic}[{self.partition}] up to offset "
                f"{self.last}: {exc}"
            ) from exc
