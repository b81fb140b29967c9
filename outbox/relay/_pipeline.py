"""The relay's pipeline: outbox rows of the held shards to Kafka, in order, then deleted.

Batches overlap: the next batch is read after the last row produced and produced while
the deliveries of the one before still arrive (``RelayOptions.pipeline_batches``); a
batch's acknowledged rows are deleted once all its deliveries settled. The read also
counts, in its own snapshot, the rows at or below the last one produced; more than are
in flight means a writer committed a lower id late, and the pipeline then settles
everything and reads from the lowest id again, as it does after a failed or cut batch or
a change of shards: a run's later event never overtakes an earlier one.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from agent_blackbox.broker import ensure_topics
from agent_blackbox.outbox.relay._counts import RelayCounts
from agent_blackbox.outbox.relay._publisher import Leases, Publisher
from agent_blackbox.outbox.relay._reader import OutboxReader
from agent_blackbox.schemas import Settings


class HeldLeases(Leases, Protocol):
    """What the pipeline needs of the relay's leases besides producing under them."""

    @property
    def shards(self) -> list[int]:
        """The shards held, in order."""
        ...

    def keep_alive(self) -> None:
        """Keep the leases (or fence) while waiting for deliveries."""
        ...

    def renew_next(self) -> None:
        """Renew at the next chance: a batch was cut for want of a valid lease."""
        ...


class BatchPipeline:
    """Reads, produces, settles and deletes the batches of the shards held.

    Args:
        settings: the topic (created on first use) and its partitions.
        reader: reads the outbox and deletes what was published.
        publisher: produces batches and settles their deliveries.
        counts: counts what settled.
        batch_size: rows a read gives at most.
        pipeline_batches: batches produced and not yet settled at most.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        reader: OutboxReader,
        publisher: Publisher,
        counts: RelayCounts,
        batch_size: int,
        pipeline_batches: int,
    ) -> None:
        self._settings = settings
        self._reader = reader
        self._publisher = publisher
        self._counts = counts
        self._batch_size = batch_size
        self._pipeline_batches = pipeline_batches
        self._topic_ready = False
        self._left_rows = False
        """The batches settled last left rows in the outbox (failed or cut)."""
        self._caught_up = False

    @property
    def caught_up(self) -> bool:
        """The last read found less than a batch while a writer's NOTIFY would have woken
        the relay for anything committed after it: the loop waits instead of reading
        again (see ``step``)."""
        return self._caught_up

    @property
    def quiet(self) -> bool:
        """Nothing queued, in flight or waiting to be deleted: shards may be handed back
        without the next owner publishing acknowledged rows again."""
        return self._publisher.queued == 0 and not self._reader.deleting

    @property
    def queued(self) -> int:
        """Messages the producer still holds."""
        return self._publisher.queued

    def collect(self, *, wait: bool) -> None:
        """Collect the deletes that finished (all with ``wait``); raises the first that
        failed (its rows stay, and the next read finds them)."""
        self._reader.collect(wait=wait)

    def step(self, stop: threading.Event | None, leases: HeldLeases, *, listening: bool) -> int:
        """Read and produce the next batch of ``leases``' shards, and settle earlier ones.

        ``listening``: a writer's NOTIFY announces every row committed from before this
        read on, so a partial batch needs no read after it (``caught_up``).

        Returns the number of rows produced or settled, and at least 1 when it read rows
        it had to leave in the outbox (0: nothing to do and nothing in flight).
        """
        self._caught_up = False
        shards = leases.shards
        if shards != self._reader.shards:
            # Another set of shards: read it from its lowest id, once nothing is in flight.
            settled = self.settle(stop, leases, keep=0)
            self._reader.follow(shards)
            if not shards:
                return settled
        if not self._topic_ready:
            ensure_topics(self._settings, {self._settings.topic: self._settings.partitions})
            self._topic_ready = True
        started = time.perf_counter()
        rows = self._reader.next_rows(in_flight=self._publisher.rows_in_flight)
        if rows is None:
            # A writer committed a row below the last one read: settle everything in
            # flight, then read from the lowest id again (that row comes first).
            return max(self.settle(stop, leases, keep=0), 1)
        if not rows:
            return self.settle(stop, leases, keep=0)
        batch = self._publisher.publish(rows, leases)
        if batch.produced:
            self._reader.advance(rows[batch.produced - 1][0])
        # Caught up: settle everything now (its rows are deleted before the relay waits)
        # and let the next NOTIFY, possibly one already waiting, say when to read. At a
        # steady trickle of writes this saves the empty reads that used to follow every
        # batch, about two statements per batch.
        caught_up = listening and len(rows) < self._batch_size and not batch.cut
        keep = 0 if batch.cut or caught_up else self._pipeline_batches - 1
        settled = self.settle(stop, leases, keep=keep)
        # Rows left behind (a failed delivery) are read again at once, not at a NOTIFY.
        in_flight = self._publisher.batches_in_flight
        self._caught_up = caught_up and not in_flight and not self._left_rows
        self._counts.batch_took(time.perf_counter() - started)
        if batch.cut:
            leases.renew_next()  # renew before the next batch
        # Rows read but left (cut) are no idle outbox: report at least one.
        return max(batch.produced, settled, int(batch.cut))

    def settle(self, stop: threading.Event | None, leases: HeldLeases, *, keep: int) -> int:
        """Wait until at most ``keep`` batches are in flight (see ``Publisher.settle``),
        then delete the rows Kafka acknowledged (fenced by the leases still held) and
        count. Returns the rows acknowledged, and at least 1 when rows were left."""
        done = self._publisher.settle(stop, keep=keep, waiting=leases.keep_alive)
        if not self._publisher.batches_in_flight:
            # Nothing in flight: the next read starts from the lowest id (behind the
            # deletes handed over), so rows left behind (failed, cut, committed late)
            # come first, which keeps every run's order.
            self._reader.rewind()
        self._left_rows = any(b.left_rows for b in done)
        if not done:
            return 0
        acked = [row_id for b in done for row_id in b.acked]
        if acked:
            self._reader.delete(acked)
        self._counts.settled(done)
        return len(acked) or int(self._left_rows)

    def purge(self) -> int:
        """Drop what is queued and not yet sent (the relay was fenced); the purged rows
        stay in the outbox. Returns how many messages were purged."""
        return self._publisher.purge()

    def wind_down(self) -> None:
        """Drop what is queued, give what was sent the message timeout to settle, then
        finish the deletes and close the reader's sessions."""
        self._publisher.wind_down()
        self._reader.close()

    def close(self) -> None:
        """Forget the batches in flight and shut the producer down."""
        self._publisher.close()
