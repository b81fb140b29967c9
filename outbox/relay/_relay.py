"""The outbox relay: publishes committed events to Kafka in order, then deletes them.

Guarantees rest on four rules. A run lives on one shard and a shard is read in id
order, so a run's events are taken in sequence order; a run has at most one message in
the producer, its next event produced only once Kafka acknowledged the one before
(``_run_order``), so no failed, timed-out or retried delivery can put a later event of a
run ahead of an earlier one on the topic. A row is deleted only after its delivery
report succeeded, so nothing committed is lost. A shard is read by the one relay that
holds its lease, and deletes are fenced by that lease. And a relay publishes only under
a lease it can show valid, stamping each message with the lease's epoch.

Pipelining. Batches overlap: the next batch is read after the last row produced and
produced while the deliveries of the one before still arrive (``pipeline_batches``); a
batch's acknowledged rows are deleted once all its deliveries settled. The read also
counts, in its own snapshot, the rows at or below the last one produced; more than are
in flight means a writer committed a lower id late (or an acknowledged row outlived a
fenced delete), and the relay then settles everything and reads from the lowest id
again, as it does after a failed or cut batch or a change of shards: a run's later
event never overtakes an earlier one that was committed before it became visible.
Reads and deletes run on threads and database sessions of their own (the outbox lane,
``_lane``), so the database works while the relay produces: after a full batch the next
one is read ahead, and acknowledged rows are deleted while the next batch goes out. Each
read sees every delete handed over before it and none handed over after it, which is
what its count is compared with.

Fencing. Every claim of a shard raises its epoch (``relay_leases.epoch``); the relay
stamps each message with ``LeaseStamp(shard, epoch)`` beside the event id, so readers
(``broker.EpochFence``) drop a copy published under an older epoch after a newer one.
The relay also keeps stale copies from being *published*: it knows locally until when
its leases are valid (see ``_lease``), produces only while a message's whole
``message.timeout.ms`` fits before that deadline less a margin, and when a renewal
shows a lease lost, or the deadline comes without a renewal (database away, renewal
too slow), it stops producing and purges what it queued; those rows stay for the next
owner. A relay frozen by SIGSTOP cannot purge, but nothing it queued outlives the
message timeout, which ends before its lease does; on SIGCONT the producer fails what
it still held (its timeout scan runs before it sends again) and the relay, finding its
deadline passed, fences itself; the rows stay. Messages already *sent* before a freeze
reach the broker then, before the next owner can claim the shard. A request the
producer had built but not yet written when the process froze may still go out on
resume: that narrow case is what the readers' fence is for. Leases are handed back
(fair share, shutdown) only when nothing is queued or in flight.

Failover. Relays heartbeat (``relay_members``) and renew their leases in one
transaction every heartbeat, from a thread of their own so that a slow batch does not
delay it; leases and heartbeat expire one TTL after it. A relay killed outright stops
renewing, and a live relay, which schedules a look at the moment the soonest foreign
lease runs out, takes its shards within a TTL plus a query. An idle relay keeps
heartbeating while it waits for a writer's NOTIFY.

Broker outages. With a finite message timeout an outage fails deliveries instead of
holding them: the rows stay in the outbox and the next batch reads them again first,
so they are published in order once the broker is back. The producer fails each
timed-out message on its own (a failover that outlasts the message timeout fails a
run's earlier event while a later one of its partition may get through), which is why a
run's next event waits for the acknowledgement of the one before: a failure stops the
run, its later rows stay with the failed one and follow it. The relay still counts any
event acknowledged after an earlier one of its run failed (``blackbox_relay_order_gaps``,
which the rule keeps at 0). A request already sent but answered only after the timeout
is reported timed out although the broker may have written it: its rows stay and are
published again, duplicates that readers absorb.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import KafkaUnavailable
from agent_blackbox.outbox.relay._backoff import Backoff
from agent_blackbox.outbox.relay._counts import RelayCounts
from agent_blackbox.outbox.relay._lease import LeaseTiming
from agent_blackbox.outbox.relay._leaseholder import Leaseholder
from agent_blackbox.outbox.relay._listener import Listener
from agent_blackbox.outbox.relay._log import first_line, log
from agent_blackbox.outbox.relay._metrics import RelayMetrics
from agent_blackbox.outbox.relay._pipeline import BatchPipeline
from agent_blackbox.outbox.relay._publisher import Publisher
from agent_blackbox.outbox.relay._reader import OutboxReader
from agent_blackbox.schemas import PermissionRefused, Settings, permission_refused


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """How a relay paces itself."""

    batch_size: int = 5_000
    lease_ttl_s: float = 2.0
    """How long a lease (and the membership heartbeat) lasts without renewal: a relay
    killed outright is replaced about this long after its last heartbeat."""
    heartbeat_s: float | None = None
    """How often leases and heartbeat are renewed; a fifth of the lease by default."""
    idle_wait_s: float = 1.0
    """Longest wait for a notification before polling the outbox anyway."""
    shutdown_grace_s: float = 10.0
    """How long SIGTERM waits for deliveries in flight."""
    depth_every_s: float = 5.0
    pipeline_batches: int = 2
    """Batches produced and not yet settled at most: the next batch is read and produced
    while the deliveries of the one before are still arriving (1: one at a time)."""


class Relay:
    """Drains the outbox shards this relay leases into the events topic.

    A coordinator of parts with one job each: the leaseholder keeps the shards' leases
    (``_leaseholder``); the pipeline moves their rows to Kafka in order (``_pipeline``),
    reading and deleting them (``_reader``) and producing them (``_publisher``); the
    listener waits for writers' notifications (``_listener``); the counts keep totals
    and metrics (``_counts``). The relay runs the loop, its backoff and the shutdown.

    Args:
        engine: the write side's database.
        settings: topic, partitions, shard count, Kafka bootstrap.
        owner: this relay's lease owner id; ``host:pid`` by default.
        metrics: where the metrics go (a fresh registry by default).
        producer_overrides: extra librdkafka settings (``message.timeout.ms`` is the
            lease's and cannot be overridden).

    Raises:
        ValueError: lease timing that cannot work, a message timeout override, or fewer
            than one batch in the pipeline.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        settings: Settings | None = None,
        owner: str | None = None,
        options: RelayOptions | None = None,
        metrics: RelayMetrics | None = None,
        producer_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings or Settings.from_env()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.options = options = options or RelayOptions()
        self.timing = timing = LeaseTiming.for_ttl(options.lease_ttl_s, options.heartbeat_s)
        if options.pipeline_batches < 1:
            raise ValueError(
                f"pipeline_batches {options.pipeline_batches!r} leaves no batch to "
                "publish: give 1 (one batch at a time) or more"
            )
        publisher = Publisher(
            self.settings,
            timing=timing,
            overrides=dict(producer_overrides or {}),
            shutdown_grace_s=options.shutdown_grace_s,
        )
        self.metrics = metrics or RelayMetrics.create()
        self._counts = RelayCounts(
            self.metrics,
            message_timeout_s=timing.message_timeout_s,
            kafka_bootstrap=self.settings.kafka_bootstrap,
            depth_every_s=options.depth_every_s,
        )
        reader = OutboxReader(
            engine,
            owner=self.owner,
            batch_size=options.batch_size,
            read_ahead=options.pipeline_batches > 1,
            idle_ms=timing.message_timeout_ms,
        )
        self._publisher = publisher
        self._pipeline = BatchPipeline(
            self.settings,
            reader=reader,
            publisher=publisher,
            counts=self._counts,
            batch_size=options.batch_size,
            pipeline_batches=options.pipeline_batches,
        )
        self._leases = Leaseholder(
            engine,
            owner=self.owner,
            shard_count=self.settings.outbox_shards,
            timing=timing,
            purge=self._purge,
        )
        self._listener = Listener(engine)
        self._closed = False

    @property
    def idle(self) -> bool:
        """True while the relay waits for a notification (nothing left to publish)."""
        return self._listener.idle

    @property
    def published(self) -> int:
        """Events Kafka acknowledged since the relay started."""
        return self._counts.published

    @property
    def failed_deliveries(self) -> int:
        """Deliveries Kafka refused since the relay started (their rows stay)."""
        return self._counts.failed_deliveries

    @property
    def timed_out(self) -> int:
        """Deliveries not settled within the message timeout (their rows stay)."""
        return self._counts.timed_out

    @property
    def fenced(self) -> int:
        """Times the relay stopped publishing for want of a valid lease."""
        return self._counts.fenced

    @property
    def epochs(self) -> Mapping[int, int]:
        """The lease epoch of every shard this relay holds."""
        return dict(self._leases.epochs)

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set; in-flight deliveries finish before returning.

        A database or Kafka that is away is retried with backoff.

        Raises:
            PermissionRefused: the database refused the session user (not the relay's
                role): retrying cannot help, so the relay stops at once.
        """
        try:
            with self._leases.heartbeats():
                self._loop(stop)
        finally:
            self.close()

    def _loop(self, stop: threading.Event) -> None:
        backoff = Backoff()
        while not stop.is_set():
            refused, timed_out = self.failed_deliveries, self.timed_out
            refusals, published = self._publisher.refusals, self.published
            try:
                if self.drain_once(stop) == 0 or self._pipeline.caught_up:
                    self._wait_for_work(stop)
                elif self._publisher.refusals > refusals and self.published == published:
                    # Left only rows the producer refuses each time: read again at a
                    # writer's NOTIFY or the polling interval, not at once.
                    self._wait_for_work(stop)
            except (SQLAlchemyError, KafkaUnavailable) as exc:
                if refusal := permission_refused(exc):
                    raise PermissionRefused(
                        f"the database refused relay {self.owner}: {refusal}; the relay "
                        "reads, publishes and deletes outbox rows and keeps shard leases: "
                        "connect as a login in the blackbox_relay role"
                    ) from exc
                delay = backoff.after_error()
                log.warning("%s; retrying in %.1fs", first_line(exc), delay)
                self._listener.close()
                stop.wait(delay)
            else:
                if self.failed_deliveries > refused:
                    stop.wait(backoff.after_refusal())
                elif self.timed_out > timed_out:
                    stop.wait(backoff.after_timeout())
                else:
                    backoff.reset()
        # Settle the batches still in flight (within the shutdown grace) so that their
        # acknowledged rows are deleted, not published again by the next relay.
        try:
            self._pipeline.settle(stop, self._leases, keep=0)
        except SQLAlchemyError as exc:
            log.warning("could not delete the last acknowledged rows: %s", first_line(exc))

    def drain_once(self, stop: threading.Event | None = None) -> int:
        """Read and produce the next batch of the leased shards, and settle earlier ones.

        Batches are pipelined: the next batch is read after the last row produced and
        produced while the deliveries of the one before are still arriving (at most
        ``RelayOptions.pipeline_batches`` unsettled); a batch's acknowledged rows are
        deleted once all its deliveries settled. A failed or cut batch, a change of
        shards, or a row committed late below the last one read drains the pipeline
        and starts again from the lowest id, which keeps every run's order.

        Returns the number of rows produced or settled, and at least 1 when it read rows
        it had to leave in the outbox (0: nothing to do and nothing in flight).
        """
        pipeline, leases = self._pipeline, self._leases
        pipeline.collect(wait=False)
        if leases.over_share:
            # Shards are to be handed back, which waits for nothing to be queued and the
            # last deletes to finish: under steady load the next batch would otherwise
            # be produced while they run, and the relay never quiet enough to hand back.
            pipeline.settle(stop, leases, keep=0)
            pipeline.collect(wait=True)
            if pipeline.quiet:
                leases.renew_next()  # hand shards back now
        leases.keep_between_batches(may_release=pipeline.quiet)
        leases.fence_if_expired("its leases ran out before they were renewed")
        self._counts.observe_depth(self.engine)
        return pipeline.step(stop, leases, listening=self._listener.listening)

    def drain(self, *, timeout: float = 60.0) -> int:
        """Publish until the leased shards are empty or ``timeout`` passes (for tools)."""
        deadline = time.monotonic() + timeout
        total = 0
        with self._leases.heartbeats():
            while time.monotonic() < deadline:
                before = self.published
                moved = self.drain_once()
                total += self.published - before
                if moved == 0 and self._leases.shards:
                    break
        self._pipeline.collect(wait=True)
        return total

    def close(self) -> None:
        """Stop listening, purge what is still queued and hand the leases back once
        nothing is in flight (else they run out by themselves); purged rows stay in the
        outbox for the next relay. Closing again does nothing; a closed relay publishes
        no more."""
        if self._closed:
            return
        self._closed = True
        self._listener.close()
        self._pipeline.wind_down()
        settled = self._pipeline.queued == 0
        self._leases.leave(release=settled)
        if not settled:
            log.warning(
                "relay %s leaves %d deliveries unsettled: its leases are left to run out",
                self.owner,
                self._pipeline.queued,
            )
        self._pipeline.close()

    def _purge(self) -> int:
        """Purge what is queued, the leaseholder having fenced the relay; the purged
        rows stay in the outbox. Returns how many messages were purged."""
        purged = self._pipeline.purge()
        self._counts.fenced_once(purged)
        return purged

    def rebalance(self) -> list[int]:
        """Heartbeat, renew leases and take or hand back shards to hold a fair share now.

        The loop does this by itself every heartbeat; the shards held afterwards are
        returned.
        """
        self._leases.renew_next()
        self._pipeline.collect(wait=True)
        self._leases.keep(may_release=self._pipeline.quiet)
        return list(self._leases.shards)

    def _wait_for_work(self, stop: threading.Event) -> None:
        """Sleep until a writer's NOTIFY or the polling interval, whichever comes first;
        the heartbeat thread renews the leases meanwhile. Shards the heartbeat took, or
        a share to hand back, end the wait early."""
        leases = self._leases
        before = leases.shards

        def moved() -> bool:
            return leases.shards != before or leases.over_share

        self._listener.wait(stop, timeout=self.options.idle_wait_s, moved=moved)
