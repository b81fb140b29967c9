"""The continuous backup: a consumer of the events topic that writes cuts to a store.

A cut is written in this order, and only then does the backup's position advance:

1. each partition's buffered messages become one segment object, under its content
   address (the same messages always give the same bytes and key);
2. the database snapshot is taken, after those events, so it holds their keys;
3. the manifest naming them is signed and written;
4. the backup's offsets in the database move to the manifest's positions
   (compare-and-set, as the views' offsets do).

A crash anywhere before 3 leaves nothing the chain names; between 3 and 4, the next
start finds the store ahead of the database and moves the database up; a running writer
whose database went away between 3 and 4 (a failover, say) retries 4 alone. Only one
writer works on a store at a time (a Postgres advisory lock, taken again on the database
that answers after a failover); a second one is refused.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from confluent_kafka import Message as KafkaMessage
from sqlalchemy import Engine

from agent_blackbox.backup._chain import head_manifest
from agent_blackbox.backup._cut import CutWriter
from agent_blackbox.backup._errors import BackupDiverged, BackupError
from agent_blackbox.backup._manifest import Manifest
from agent_blackbox.backup._metrics import BackupMetrics
from agent_blackbox.backup._outage import RetryPolicy, StoreOutage
from agent_blackbox.backup._pending import PendingCut
from agent_blackbox.backup._position import BackupPosition
from agent_blackbox.backup._snapshot import SnapshotTaker
from agent_blackbox.backup._store import BackupStore, StoreUnreachable
from agent_blackbox.backup._store_lock import StoreLock
from agent_blackbox.backup._topic_reader import TopicReader
from agent_blackbox.broker import KafkaUnavailable, watermarks
from agent_blackbox.consumers import load_offsets
from agent_blackbox.schemas import CheckpointSigner, EnvelopeCodec, Settings
from agent_blackbox.wiring import COMMAND_POOL, SERVICE_POOL

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BackupPolicy:
    """When the writer rolls its buffers into a cut."""

    roll_bytes: int = 64 * 1024 * 1024
    """A cut is written once this many bytes of messages are buffered..."""
    roll_seconds: float = 60.0
    """...or once the oldest buffered message waited this long."""
    batch: int = 5_000
    """Messages taken from Kafka per poll."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How a failed cut is tried again, and how long an unreachable store is waited for."""

    def __post_init__(self) -> None:
        if self.roll_bytes < 1 or self.roll_seconds <= 0 or self.batch < 1:
            raise ValueError(
                "a backup policy needs roll_bytes >= 1, roll_seconds > 0 and batch >= 1"
            )


def backup_group(store: BackupStore) -> str:
    """The consumer group the backup to ``store`` keeps its offsets under: one per
    store, so a second store starts its own series."""
    return "blackbox-backup-" + hashlib.sha256(store.describe().encode()).hexdigest()[:16]


def recorded_offsets(
    settings: Settings, store: BackupStore, partitions: Iterable[int]
) -> dict[int, int] | None:
    """How far the database says the backup to ``store`` got in ``partitions``
    (partition -> next offset); None when it records nothing.

    Raises:
        SQLAlchemyError: the database cannot be read (a disaster took it).
    """
    wanted = [(settings.topic, p) for p in partitions]
    engine = COMMAND_POOL.engine(settings.database_url)
    try:
        with engine.connect() as conn:
            found = load_offsets(conn, group_id=backup_group(store), partitions=wanted)
    finally:
        engine.dispose()
    return {p: o for (_t, p), o in found.items() if o is not None} or None


class BackupWriter:
    """Backs up the events topic to ``store`` while it runs (see the module).

    Args:
        settings: the production database, Kafka and topic.
        store: where the backup goes.
        signer: the checkpoint signer's key, which signs each manifest.
        engine: the production database (default: one from ``settings``).
        policy: when to roll.
        metrics: where to count (default: a registry of its own, ``metrics.registry``).
    """

    def __init__(
        self,
        settings: Settings,
        store: BackupStore,
        *,
        signer: CheckpointSigner,
        engine: Engine | None = None,
        policy: BackupPolicy | None = None,
        metrics: BackupMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._topic = settings.topic
        self._store = store
        self._signer = signer
        self._owns_engine = engine is None
        self._engine = engine or SERVICE_POOL.engine(settings.database_url)
        self._policy = policy or BackupPolicy()
        self.metrics = metrics or BackupMetrics(topic=settings.topic)
        self._outage = StoreOutage(self._policy.retry, self.metrics, store=store.describe())
        self.group_id = backup_group(store)
        self._lock = StoreLock(self._engine, name=self.group_id, store=store.describe())
        self._reader = TopicReader(settings, group_id=self.group_id)
        self._head: Manifest | None = None
        self._position = BackupPosition(
            self._engine, topic=self._topic, group_id=self.group_id, store=store.describe()
        )
        self._pending = PendingCut(self._topic, EnvelopeCodec())
        self._cuts: CutWriter | None = None
        self._unrecorded: Manifest | None = None
        """A manifest in the store whose offsets the database does not record yet."""
        self.written = 0
        """Messages written in cuts by this writer."""
        self.written_bytes = 0
        """Bytes of the segments this writer wrote."""

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> BackupWriter:
        self.open()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Take the store's lock, agree the start with the store's newest manifest and
        the database, and assign every partition of the topic.

        Raises:
            BackupBusy: another writer holds the store.
            BackupDiverged: the database and the store disagree on what was backed up.
            KafkaUnavailable, StoreError, BackupError: a service is unreachable.
        """
        self._lock.acquire()
        try:
            lows = {p: low for p, (low, _high) in watermarks(self._settings, self._topic).items()}
            self._head = head_manifest(self._store)
            if self._head is not None:  # the newest cut's age counts from its own time
                created = datetime.fromisoformat(self._head.created_at)
                self.metrics.cut_written(at=created.timestamp(), messages=0, size=0)
            read, lost = self._position.resume(self._head, lows)
            self._pending.resume(read, lost)
            self._cuts = CutWriter(
                self._store,
                signer=self._signer,
                snapshots=SnapshotTaker(self._engine, self._store),
                topic=self._topic,
            )
            self._reader.open(read)
        except BaseException:
            self.close()
            raise

    def open_riding_outages(self, stop: threading.Event) -> bool:
        """:meth:`open`, tried again with back-off while the store is unreachable (as
        :meth:`run` retries a cut); False when ``stop`` was set before it opened.

        Raises:
            StoreOutageTooLong: the store stayed unreachable for the policy's
                ``give_up_after_s``.
            BackupBusy, BackupDiverged, KafkaUnavailable, StoreError, BackupError: as
                :meth:`open`.
        """
        while not stop.is_set():
            try:
                self.open()
            except StoreUnreachable as exc:
                stop.wait(self._outage.failed(exc))
                continue
            self._outage.succeeded()
            return True
        return False

    def close(self) -> None:
        """Leave Kafka and release the store (buffered messages not in a cut are read
        again by the next writer)."""
        self._reader.close()
        self._lock.release()
        if self._owns_engine:
            self._engine.dispose()

    # -- running ---------------------------------------------------------------------

    def run(
        self, stop: threading.Event, *, on_cut: Callable[[Manifest], None] | None = None
    ) -> None:
        """Back up until ``stop`` is set, writing a cut whenever the policy says. On
        stop, what is buffered is written as a last cut.

        A cut that fails (store, database or broker away) is tried again with a capped
        exponential back-off, AS IT WAS: no message is read meanwhile, so the retry
        writes the same segments (those already stored are not uploaded again) and the
        cuts before and after it neither overlap nor leave a gap.

        Raises:
            StoreOutageTooLong: the store stayed unreachable for the policy's
                ``give_up_after_s`` (see :mod:`._outage`).
            BackupDiverged: another writer moved the offsets.
        """
        retry_at: float | None = None
        while not stop.is_set():
            if retry_at is None:
                self.poll(0.5)
            else:  # a failed cut waits for its retry; nothing more is read meanwhile
                self._outage.tick()
                stop.wait(max(0.0, min(0.5, retry_at - time.monotonic())))
                if time.monotonic() < retry_at or stop.is_set():
                    continue
            if retry_at is None and not self._due():
                continue
            retry_at = self._attempt_cut(on_cut)
        if self.buffered:
            manifest = self.cut()
            if on_cut is not None:
                on_cut(manifest)

    def _attempt_cut(self, on_cut: Callable[[Manifest], None] | None) -> float | None:
        """Write a cut; None when it was written, else when to try again."""
        try:
            manifest = self.cut()
        except StoreUnreachable as exc:
            self.metrics.cut_failed()
            return time.monotonic() + self._outage.failed(exc)
        except (BackupError, KafkaUnavailable) as exc:
            if isinstance(exc, BackupDiverged):
                raise
            self.metrics.cut_failed()
            wait = self._outage.other_failure()
            log.warning("backup cut failed, retrying in %.0f s: %s", wait, exc)
            return time.monotonic() + wait
        self._outage.succeeded()
        if on_cut is not None:
            on_cut(manifest)
        return None

    def catch_up(
        self,
        *,
        timeout_s: float = 300.0,
        progress: Callable[[int, int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> Manifest:
        """Back up everything the topic holds now, and write a cut (also when nothing
        was new: the snapshot is fresh). ``progress(read, total)`` is called as it goes.

        Given ``stop``, a cut the store is away for is tried again with back-off, as
        :meth:`run` does, and setting ``stop`` interrupts the catch-up.

        Raises:
            BackupError: the topic stalled for ``timeout_s`` before its end was read, or
                ``stop`` was set (what was read and not cut is read again next time).
            StoreOutageTooLong: the store stayed unreachable for ``give_up_after_s``.
        """
        ends = {p: high for p, (_low, high) in watermarks(self._settings, self._topic).items()}
        total = sum(max(0, ends[p] - self._pending.read.get(p, 0)) for p in ends)
        deadline = time.monotonic() + timeout_s
        while any(self._pending.read.get(p, 0) < end for p, end in ends.items()):
            _interrupted(stop)
            before = sum(self._pending.read.values())
            self.poll(0.5)
            if sum(self._pending.read.values()) != before:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise BackupError(
                    f"reading {self._topic} stalled for {timeout_s:.0f} s at "
                    f"{self._pending.where()}; check that Kafka is reachable"
                )
            if progress is not None:
                left = sum(max(0, ends[p] - self._pending.read.get(p, 0)) for p in ends)
                progress(total - left, total)
            if self.buffered >= self._policy.roll_bytes:
                self._cut_riding_outages(stop)
        return self._cut_riding_outages(stop)

    def _cut_riding_outages(self, stop: threading.Event | None) -> Manifest:
        """:meth:`cut`, tried again as it was while the store is away (given ``stop``)."""
        while True:
            try:
                manifest = self.cut()
            except StoreUnreachable as exc:
                if stop is None:
                    raise
                self.metrics.cut_failed()
                stop.wait(self._outage.failed(exc))
                _interrupted(stop)
                continue
            self._outage.succeeded()
            return manifest

    @property
    def buffered(self) -> int:
        """Bytes of messages read but not yet in a cut."""
        return self._pending.size

    @property
    def head(self) -> Manifest | None:
        """The newest manifest written (or found at the start)."""
        return self._head

    def poll(self, timeout: float) -> int:
        """Take what Kafka has (up to one batch) into the buffers; how many messages."""
        messages = self._reader.consume(self._policy.batch, timeout)
        for message in messages:
            self._take(message)
        self._report_lag()
        return len(messages)

    def cut(self) -> Manifest:
        """Write the buffers as segments, take the snapshot, sign and write the manifest,
        then advance the stored offsets (see the module for why in this order).

        Raises:
            StoreError, BackupError: the store or the database failed; nothing the chain
                names was lost, and the buffers are kept for the next try.
            BackupDiverged: another writer moved the offsets.
        """
        if self._cuts is None:
            raise BackupError("the backup writer is not open; call open() first")
        # After a failover the lock went with the old primary's session: take it again
        # on the new one before writing anything.
        self._lock.hold()
        # A manifest written whose offsets could not be recorded (the database went
        # away in between) is recorded on the retry, never written a second time.
        manifest = self._unrecorded or self._cuts.write(self._pending, after=self._head)
        self._unrecorded = manifest
        self._position.advance(manifest.positions)
        self._unrecorded = None
        self._head = manifest
        segments = manifest.segments
        count, size = sum(s.count for s in segments), sum(s.size for s in segments)
        self.written += count
        self.written_bytes += size
        self.metrics.cut_written(at=time.time(), messages=count, size=size)
        self._pending.written()
        self._report_lag()
        return manifest

    # -- inside ----------------------------------------------------------------------

    def _take(self, message: KafkaMessage) -> None:
        partition, offset = message.partition() or 0, message.offset() or 0
        expected = self._pending.expected(partition, offset)
        lost = self._reader.lost(partition, expected, offset) if offset > expected else None
        if lost is not None:
            self._pending.lost.append(lost)
            self.metrics.lost(lost.end_offset - lost.first_offset)
        self._pending.add(message)

    def _due(self) -> bool:
        policy = self._policy
        return self._pending.due(roll_bytes=policy.roll_bytes, roll_seconds=policy.roll_seconds)

    def _report_lag(self) -> None:
        for partition, high in self._reader.ends(self._pending.read).items():
            self.metrics.lag(partition, high - (self._position.stored.get(partition) or 0))


def _interrupted(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise BackupError(
            "interrupted: no cut was written for what this backup read since its last "
            "cut; the next backup reads it again"
        )
