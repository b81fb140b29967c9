"""The consumer runtime: Kafka in, one Postgres transaction per batch, offsets inside it.

Assignment is eager (``range``): rebalance callbacks run only inside ``consume()``,
and a batch is always committed or rolled back before ``consume()`` is called again,
so a revocation never finds work in flight and the simpler protocol loses nothing.
The offsets Kafka would normally keep live in ``blackbox_views.consumer_offsets``,
written in the same transaction as the rows they produced; Kafka's own committed
offsets are only updated afterwards (at most once a second), for lag dashboards, and
never read.

Every message passes the consumer's epoch fence before anything else sees it: a copy
that a relay published after its lease had moved on (its epoch is older than one already
read for its shard in that partition) is dropped, counted and never projected. The
fence is stored beside the offsets, so a restart or another member judges the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, Message
from confluent_kafka import TopicPartition as KafkaPartition
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine

from agent_blackbox.broker import ClientConfig, ensure_topics, partition_count
from agent_blackbox.consumers._assignment import Assignment
from agent_blackbox.consumers._batch import BatchOutcome, Delivered, Projection
from agent_blackbox.consumers._committer import BatchCommitter
from agent_blackbox.consumers._errors import ConsumerError
from agent_blackbox.consumers._group_member import GroupMember
from agent_blackbox.consumers._idle import IdleClock
from agent_blackbox.consumers._loop import ConsumeLoop
from agent_blackbox.consumers._metrics import ConsumerMetrics
from agent_blackbox.consumers._offsets import OffsetMove, OffsetsMoved, TopicPartition
from agent_blackbox.consumers._pipeline import Pipeline
from agent_blackbox.consumers._redacted_views import RedactionCheck
from agent_blackbox.consumers._sorting import Batch, BatchSorter, Screen
from agent_blackbox.consumers._view_database import ViewDatabase
from agent_blackbox.consumers._views import apply_batch, views_screen
from agent_blackbox.consumers._vouching import Vouching
from agent_blackbox.schemas import CheckpointVerifier, EnvelopeCodec, Settings

log = logging.getLogger(__name__)


class ConsumerRuntime:
    """Consumes the event topic and applies each batch with a projection, exactly once.

    Each batch: stale relay copies are dropped, poison messages go to the dead-letter
    topic (acknowledged first), then one transaction advances the stored offsets and
    fences (compare-and-set), applies the projection and commits. Any failure rolls
    everything back and rewinds the consumer to the stored offsets and fences.

    Args:
        instance_id: static group membership (``group.instance.id``): a consumer that
            restarts with the same id gets its partitions back without a rebalance.
            Default: ``settings.consumer_instance_id``; ``""`` joins without one.
    """

    def __init__(
        self,
        settings: Settings,
        projection: Projection,
        *,
        name: str,
        group_id: str | None = None,
        screen: Screen | None = None,
        engine: Engine | None = None,
        codec: EnvelopeCodec | None = None,
        batch_size: int = 2000,
        registry: CollectorRegistry | None = None,
        client_config: ClientConfig | None = None,
        instance_id: str | None = None,
    ) -> None:
        self._settings = settings
        self.name = name
        self.group_id = group_id or settings.consumer_group
        self._database = ViewDatabase(settings, engine=engine, consumer=name)
        self._client_config = dict(client_config or {})
        chosen = settings.consumer_instance_id if instance_id is None else instance_id
        self.instance_id = chosen or None
        self._member = GroupMember(
            settings,
            name=name,
            group_id=self.group_id,
            instance_id=self.instance_id,
            client_config=self._client_config,
            batch_size=batch_size,
        )
        self._sorter = BatchSorter(
            codec or EnvelopeCodec(), screen=screen, on_error=self._member.handle_error
        )
        self._metrics = ConsumerMetrics(
            consumer=name, group=self.group_id, topic=settings.topic, registry=registry
        )
        self._assignment = Assignment(self._database, group_id=self.group_id, consumer=name)
        self._committer = BatchCommitter(
            settings,
            projection,
            database=self._database,
            group_id=self.group_id,
            client_config=self._client_config,
        )
        self.drained: list[TopicPartition] = []
        """The partitions read to their end when :meth:`run` last stopped for idleness."""
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Create missing topics and join the group; :meth:`poll_once` calls it lazily.

        Raises:
            KafkaUnavailable: the broker is unreachable or the client cannot start.
        """
        if self._member.joined:
            return
        if self._closed:
            raise ConsumerError(f"consumer {self.name!r} is closed; create a new one")
        self._assignment.drop_all()  # a fenced client's partitions went with it
        ensure_topics(self._settings, client_config=self._client_config)
        self._committer.open()
        self._member.join(on_assign=self._on_assign, on_revoke=self._on_revoke)

    @property
    def engine(self) -> Engine:
        """The database the views live in."""
        return self._database.engine

    def close(self) -> None:
        """Leave the group, flush the dead-letter producer, release the database."""
        if self._closed:
            return
        self._closed = True
        self._member.leave(held=self._assignment.positions)
        self._committer.close()
        self._database.close()

    def __enter__(self) -> ConsumerRuntime:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event | None = None,
        max_idle_s: float | None = None,
        *,
        on_batch: Callable[[BatchOutcome], None] | None = None,
        poll_timeout_s: float = 0.5,
    ) -> BatchOutcome:
        """Consume until ``stop`` is set or, with ``max_idle_s``, until it is idle.

        Idle means: partitions are assigned, nothing arrived for ``max_idle_s`` seconds
        and the broker's high watermarks show nothing left to read in any of them. The
        idle clock starts only once partitions are assigned (a consumer waiting for a
        rebalance is not idle), and a consumer that knows of lag keeps consuming.

        Batches are pipelined (see :mod:`agent_blackbox.consumers._pipeline`): each
        commits on a worker thread while the next is read and decoded, in order.

        A lost database or an unacknowledged dead letter is retried with backoff;
        the batches in progress when ``stop`` is set are still committed.

        Returns:
            The sum of every committed batch's outcome.

        Raises:
            KafkaUnavailable, ViewsNotMigrated, ProjectionFailed: not retryable here.
        """
        idle = IdleClock(self, max_idle_s)
        loop = ConsumeLoop(
            self.name,
            stop=stop or threading.Event(),
            idle=idle,
            between=self._between_batches,
            on_batch=on_batch,
        )
        with Pipeline(self) as pipeline:
            total = loop.drive(pipeline, poll_timeout_s)
        if loop.idled:
            self.drained = idle.drained
        return total

    @property
    def assigned(self) -> list[TopicPartition]:
        """The partitions this consumer holds now."""
        return self._assignment.held

    @property
    def stale_dropped(self) -> int:
        """Stale relay copies the fence has refused since this consumer started (a
        copy in a batch that was rolled back and read again counts each time)."""
        return self._assignment.fence.dropped

    def lag(self, *, timeout_s: float = 5.0) -> int | None:
        """Messages of the assigned partitions not yet applied, from the broker's high
        watermarks; ``None`` when nothing is assigned or the broker did not answer."""
        return self._member.lag(self._assignment.positions, timeout_s=timeout_s)

    def poll_once(self, timeout: float) -> BatchOutcome | None:
        """Consume and commit at most one batch.

        Returns:
            What the batch did, or ``None`` when no message arrived (or the batch
            raced another consumer and was rolled back).

        Raises:
            ViewStoreUnavailable: the database failed; nothing was committed and the
                next call rewinds to the stored offsets first.
            DeadLetterFailed: a poison message was not acknowledged; likewise.
            KafkaUnavailable: the Kafka client failed fatally.
            ViewsNotMigrated: the view tables are missing.
            ProjectionFailed: the projection raised something unexpected.
        """
        outcome = self._poll(timeout)
        self._between_batches()
        return outcome

    def _between_batches(self) -> None:
        """A subclass's periodic work: called after every poll, no batch in flight."""

    def _poll(self, timeout: float) -> BatchOutcome | None:
        messages = self._receive(timeout)
        try:
            batch = self._sort(messages)
        except BaseException:
            self._batch_failed()
            raise
        if not batch.next_offsets:
            return None
        moves = self._moves(batch)
        return self._settle(batch, lambda: self._commit(batch, moves))

    def _receive(self, timeout: float) -> list[Message]:
        """Start or rewind when needed, then consume (see :meth:`GroupMember.consume`)."""
        self.start()
        if self._assignment.unsynced:
            self._sync()
        return self._member.consume(timeout)

    def _settle(self, batch: Batch, commit: Callable[[], BatchOutcome]) -> BatchOutcome | None:
        """Wait for ``commit`` of ``batch`` and take its result: the outcome, or
        ``None`` when it raced another consumer (rolled back, rewound)."""
        try:
            outcome = commit()
        except OffsetsMoved as exc:
            log.warning("consumer %s: %s", self.name, exc)
            self._batch_failed()
            self._sync()
            return None
        except BaseException:
            # Whatever failed, the consumer's position is now past messages that were
            # not committed: rewind before consuming again.
            self._batch_failed()
            raise
        self._committed(batch, outcome, time.monotonic() - batch.started)
        return outcome

    # -- one batch --------------------------------------------------------------------

    def _sort(self, messages: Sequence[Message]) -> Batch:
        """Sort consumed ``messages`` into a batch (see :class:`BatchSorter`)."""
        return self._sorter.sort(messages, self._assignment)

    def _moves(self, batch: Batch) -> list[OffsetMove]:
        """The offset advances of ``batch``, with the fence as it stands after it: taken
        by the reading thread before the next batch is sorted (which moves the fence),
        from the positions the previous batch's commit left."""
        return self._assignment.moves(batch.next_offsets)

    def _commit(self, batch: Batch, moves: Sequence[OffsetMove]) -> BatchOutcome:
        """Commit ``batch`` (see :meth:`BatchCommitter.commit`); :meth:`run` calls it on
        its worker thread."""
        return self._committer.commit(batch, moves)

    def _committed(self, batch: Batch, outcome: BatchOutcome, seconds: float) -> None:
        self._assignment.advance(batch.next_offsets)
        self._metrics.batch_committed(outcome, seconds)
        for partition, behind in self._member.cached_lag(batch.next_offsets).items():
            self._metrics.lag(partition, behind)
        self._member.committed(batch.next_offsets, held=self._assignment.positions)

    def _batch_failed(self) -> None:
        self._metrics.batch_failed()
        self._assignment.lose_track()

    # -- rebalancing --------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        self._assignment.assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        self._assignment.revoke(consumer, partitions)

    def _sync(self) -> None:
        """Rewind every assigned partition to its stored offset and fence."""
        self._assignment.rewind(self._member.client)


class ViewConsumer(ConsumerRuntime):
    """The consumer that builds the runs view and the events index.

    Call :func:`agent_blackbox.consumers.migrate_views` once before starting it.

    Events on another partition than their run's key maps to are flagged and left out
    (the topic's partition count is read from the broker on every assignment), and a
    ``run.redacted`` is acted on only when the write side confirms it.

    Args:
        verifier: the retention job's public keys, which confirm a signed
            ``run.redacted`` where this database holds no deletion ledger.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        group_id: str | None = None,
        engine: Engine | None = None,
        codec: EnvelopeCodec | None = None,
        batch_size: int = 2000,
        registry: CollectorRegistry | None = None,
        client_config: ClientConfig | None = None,
        verifier: CheckpointVerifier | None = None,
        instance_id: str | None = None,
    ) -> None:
        self._redactions = RedactionCheck(verifier)
        self._vouching = Vouching()
        self._partitions: dict[str, int] = {}
        super().__init__(
            settings,
            self._project,
            name="views",
            group_id=group_id,
            screen=views_screen,
            engine=engine,
            codec=codec,
            batch_size=batch_size,
            registry=registry,
            client_config=client_config,
            instance_id=instance_id,
        )

    def _project(self, conn: Connection, records: Sequence[Delivered]) -> BatchOutcome:
        for topic in {r.topic for r in records} - self._partitions.keys():
            self._partitions[topic] = partition_count(self._settings, topic)
        # The commit need not wait for the WAL flush. A commit that a database crash
        # loses takes its offsets with its rows (one transaction), and every later
        # commit with it (the WAL is replayed in order), so the consumer reads the same
        # messages again from the older offsets. Every effect of a batch is in its
        # transaction: its dead letters were acknowledged before (as on any retry), and
        # Kafka's committed offsets are informational, never read. Nothing is lost or
        # counted twice; the crash costs a re-read.
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
        return apply_batch(
            conn,
            records,
            partitions=self._partitions,
            redactions=self._redactions,
            vouching=self._vouching,
        )

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        self._partitions.clear()  # a topic may have grown: read its count again
        super()._on_assign(consumer, partitions)
