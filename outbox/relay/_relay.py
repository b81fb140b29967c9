"""The outbox relay: publishes committed events to Kafka in order, then deletes them.

Guarantees rest on four rules. A run lives on one shard and a shard is read in id
order, so a run's events are produced in sequence order; the idempotent producer keeps
that order on the partition across retries. A row is deleted only after its delivery
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
so they are published in order once the broker is back. One rare case remains: the
producer may time out an earlier queued message of a partition and still deliver a
later one (its timeout scan and a reconnect racing). The later event then precedes the
earlier one in the topic; readers order by sequence, and the relay counts the case
(``blackbox_relay_order_gaps``) and logs it. A request already sent but answered only
after the timeout is reported timed out although the broker may have written it: its
rows stay and are published again, duplicates that readers absorb.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import (
    KafkaUnavailable,
    LeaseStamp,
    ensure_topics,
    new_producer,
    producer_config,
)
from agent_blackbox.outbox.relay._batch import Batch, Row
from agent_blackbox.outbox.relay._counts import RelayCounts
from agent_blackbox.outbox.relay._lease import LeaseDeadline, LeaseTiming
from agent_blackbox.outbox.relay._listener import Listener
from agent_blackbox.outbox.relay._log import first_line, log
from agent_blackbox.outbox.relay._metrics import RelayMetrics
from agent_blackbox.outbox.relay._reader import OutboxReader
from agent_blackbox.schemas import PermissionRefused, Settings, permission_refused

EVENT_ID_HEADER = "blackbox.event_id"

_SEED_LEASES = text(
    "INSERT INTO blackbox.relay_leases (shard) SELECT generate_series(0, :shards - 1) "
    "ON CONFLICT (shard) DO NOTHING"
)
_HEARTBEAT = text(
    "INSERT INTO blackbox.relay_members (owner, expires_at) "
    "VALUES (:me, now() + make_interval(secs => :ttl)) "
    "ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at"
)
_LIVE_PEERS = text(
    "SELECT count(*) FROM blackbox.relay_members WHERE owner <> :me AND expires_at > now()"
)
_LEAVE = text("DELETE FROM blackbox.relay_members WHERE owner = :me")
# Only a lease that is still valid is renewed (its epoch kept); one that ran out, ours
# included, is claimed again, which raises its epoch.
_RENEW = text(
    "UPDATE blackbox.relay_leases SET expires_at = now() + make_interval(secs => :ttl) "
    "WHERE owner = :me AND shard < :shards AND expires_at >= now() RETURNING shard, epoch"
)
_CLAIM = text(
    """
    UPDATE blackbox.relay_leases
       SET owner = :me, expires_at = now() + make_interval(secs => :ttl), epoch = epoch + 1
     WHERE shard IN (
        SELECT shard FROM blackbox.relay_leases
         WHERE shard < :shards AND (owner IS NULL OR expires_at < now())
         ORDER BY shard LIMIT :wanted FOR UPDATE SKIP LOCKED)
    RETURNING shard, epoch
    """
)
# Seconds until the soonest lease held by another relay runs out (None: there is none).
_SOONEST_FOREIGN = text(
    "SELECT extract(epoch FROM min(expires_at) - now())::float8 FROM blackbox.relay_leases "
    "WHERE shard < :shards AND owner <> :me AND expires_at > now()"
)
_RELEASE = text(
    "UPDATE blackbox.relay_leases SET owner = NULL, expires_at = NULL "
    "WHERE owner = :me AND NOT shard = ANY(:keep)"
)
# Every transaction of the relay that takes row locks (lease renewal and claims, deletes)
# bounds how long it may sit idle: a relay frozen inside one (SIGSTOP, a VM pause) would
# otherwise hold its lease rows, so no other relay could claim them (the claim skips
# locked rows), or its outbox rows, so the next owner's deletes would wait. The server
# ends such a session after the bound, well before the frozen relay's leases run out.
_BOUNDED = text("SELECT set_config('idle_in_transaction_session_timeout', :idle_ms, true)")


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


_Headers = list[tuple[str, str | bytes | None]]


class Relay:
    """Drains the outbox shards this relay leases into the events topic.

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
        self.options = options or RelayOptions()
        self.timing = LeaseTiming.for_ttl(self.options.lease_ttl_s, self.options.heartbeat_s)
        if self.options.pipeline_batches < 1:
            raise ValueError(
                f"pipeline_batches {self.options.pipeline_batches!r} leaves no batch to "
                "publish: give 1 (one batch at a time) or more"
            )
        overrides = dict(producer_overrides or {})
        if "message.timeout.ms" in overrides:
            raise ValueError(
                "message.timeout.ms is derived from the lease TTL (half of it) so that "
                "nothing queued outlives a lease; change the lease TTL instead"
            )
        self.metrics = metrics or RelayMetrics.create()
        self._counts = RelayCounts(
            self.metrics,
            message_timeout_s=self.timing.message_timeout_s,
            kafka_bootstrap=self.settings.kafka_bootstrap,
            depth_every_s=self.options.depth_every_s,
        )
        self._producer = new_producer(
            self.settings,
            producer_config(
                self.settings, message_timeout_ms=self.timing.message_timeout_ms, **overrides
            ),
            logger=logging.getLogger("blackbox.relay.librdkafka"),
        )
        self._deadline = LeaseDeadline(self.timing)
        self._idle_bound = {"idle_ms": str(self.timing.message_timeout_ms)}
        self._shards: list[int] = []
        self._stamps: dict[int, tuple[str, bytes]] = {}
        # Batches produced and not yet settled, oldest first.
        self._window: deque[Batch] = deque()
        self._epochs: dict[int, int] = {}
        self._next_check = -math.inf
        self._over_share = False
        self._seeded = False
        self._beating = False
        """True while the heartbeat thread renews the leases (``_heartbeats``)."""
        # Lease state is renewed by a heartbeat thread while the loop publishes (see
        # _heartbeats); the lock keeps one renewal or fence at a time.
        self._lease_lock = threading.RLock()
        # Reads and deletes of outbox rows run on threads and sessions of their own, so
        # that the database works while this thread produces.
        self._reader = OutboxReader(
            engine,
            owner=self.owner,
            batch_size=self.options.batch_size,
            read_ahead=self.options.pipeline_batches > 1,
            idle_ms=self.timing.message_timeout_ms,
        )
        self._listener = Listener(engine)
        self._topic_ready = False
        self._closed = False
        self._left_rows = False
        """The batches settled last left rows in the outbox (failed or cut)."""
        self._caught_up = False
        """The last read found less than a batch while a writer's NOTIFY would have woken
        the relay for anything committed after it: the loop waits instead of reading
        again (see ``drain_once``)."""

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
        return dict(self._epochs)

    # Loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set; in-flight deliveries finish before returning.

        A database or Kafka that is away is retried with backoff.

        Raises:
            PermissionRefused: the database refused the session user (not the relay's
                role): retrying cannot help, so the relay stops at once.
        """
        try:
            with self._heartbeats():
                self._loop(stop)
        finally:
            self.close()

    def _loop(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            refused, timed_out = self.failed_deliveries, self.timed_out
            try:
                if self.drain_once(stop) == 0 or self._caught_up:
                    self._wait_for_work(stop)
            except (SQLAlchemyError, KafkaUnavailable) as exc:
                if refusal := permission_refused(exc):
                    raise PermissionRefused(
                        f"the database refused relay {self.owner}: {refusal}; the relay "
                        "reads, publishes and deletes outbox rows and keeps shard leases: "
                        "connect as a login in the blackbox_relay role"
                    ) from exc
                failures += 1
                delay = min(0.2 * 2**failures, 5.0)
                log.warning("%s; retrying in %.1fs", first_line(exc), delay)
                self._listener.close()
                stop.wait(delay)
                continue
            if self.failed_deliveries > refused:
                # Kafka refused deliveries for good (topic deleted, not authorised):
                # their rows stay; back off instead of hammering the broker.
                failures += 1
                stop.wait(min(0.5 * 2**failures, 30.0))
                continue
            if self.timed_out > timed_out:
                # Kafka is slow or away: each try already waited a message timeout.
                failures += 1
                stop.wait(min(0.1 * 2**failures, 2.0))
                continue
            failures = 0
        # Settle the batches still in flight (within the shutdown grace) so that their
        # acknowledged rows are deleted, not published again by the next relay.
        try:
            self._settle(stop, keep=0)
        except SQLAlchemyError as exc:
            log.warning("could not delete the last acknowledged rows: %s", first_line(exc))

    @contextmanager
    def _heartbeats(self) -> Iterator[None]:
        """Renew leases and heartbeat from a thread of its own while the block runs, so
        that a slow read or delete of a large batch does not let the leases run out.

        A process that freezes stops both, as it must. Handing shards back stays with
        the loop, between batches, when nothing is queued.
        """
        done = threading.Event()

        def beat() -> None:
            while not done.wait(max(self._next_check - time.monotonic(), 0.01)):
                try:
                    self._keep_leases(may_release=False)
                except SQLAlchemyError as exc:
                    log.warning("could not renew leases: %s", first_line(exc))
                    self._next_check = time.monotonic() + self.timing.heartbeat_s / 2
                self._fence_if_expired("its leases could not be renewed before they ran out")

        thread = threading.Thread(target=beat, name=f"heartbeat {self.owner}", daemon=True)
        thread.start()
        self._beating = True
        try:
            yield
        finally:
            self._beating = False
            done.set()
            thread.join(timeout=30)

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
        self._caught_up = False
        self._reader.collect(wait=False)
        if self._over_share:
            # Shards are to be handed back, which waits for nothing to be queued.
            self._settle(stop, keep=0)
            if self._quiet():
                self._next_check = -math.inf  # hand shards back now
        if not self._beating or self._next_check == -math.inf:
            # Renewing is the heartbeat thread's when it runs; handing back is ours.
            self._keep_leases(may_release=self._quiet(), wait=False)
        self._fence_if_expired("its leases ran out before they were renewed")
        self._counts.observe_depth(self.engine)
        shards = self._shards
        if shards != self._reader.shards:
            # Another set of shards: read it from its lowest id, once nothing is in flight.
            settled = self._settle(stop, keep=0)
            self._reader.follow(shards)
            if not shards:
                return settled
        if not self._topic_ready:
            ensure_topics(self.settings, {self.settings.topic: self.settings.partitions})
            self._topic_ready = True
        started = time.perf_counter()
        # Listening since before this read: every row committed after the read began
        # announces itself with a NOTIFY, so a partial batch needs no read after it.
        listening = self._listener.listening
        rows = self._reader.next_rows(in_flight=sum(b.produced for b in self._window))
        if rows is None:
            # A writer committed a row below the last one read: settle everything in
            # flight, then read from the lowest id again (that row comes first).
            return max(self._settle(stop, keep=0), 1)
        if not rows:
            return self._settle(stop, keep=0)
        batch = self._publish(rows, stop)
        if batch.produced:
            self._reader.advance(rows[batch.produced - 1][0])
        # Caught up: settle everything now (its rows are deleted before the relay waits)
        # and let the next NOTIFY, possibly one already waiting, say when to read. At a
        # steady trickle of writes this saves the empty reads that used to follow every
        # batch, about two statements per batch.
        caught_up = listening and len(rows) < self.options.batch_size and not batch.cut
        keep = 0 if batch.cut or caught_up else self.options.pipeline_batches - 1
        settled = self._settle(stop, keep=keep)
        # Rows left behind (a failed delivery) are read again at once, not at a NOTIFY.
        self._caught_up = caught_up and not self._window and not self._left_rows
        self._counts.batch_took(time.perf_counter() - started)
        if batch.cut:
            self._next_check = -math.inf  # renew before the next batch
        # Rows read but left (cut) are no idle outbox: report at least one.
        return max(batch.produced, settled, int(batch.cut))

    def _quiet(self) -> bool:
        """Nothing queued, in flight or waiting to be deleted: shards may be handed back
        without the next owner publishing acknowledged rows again."""
        return len(self._producer) == 0 and not self._reader.deleting

    def drain(self, *, timeout: float = 60.0) -> int:
        """Publish until the leased shards are empty or ``timeout`` passes (for tools)."""
        deadline = time.monotonic() + timeout
        total = 0
        with self._heartbeats():
            while time.monotonic() < deadline:
                before = self.published
                moved = self.drain_once()
                total += self.published - before
                if moved == 0 and self._shards:
                    break
        self._reader.collect(wait=True)
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
        self._producer.purge(in_queue=True, in_flight=False, blocking=True)
        # In-flight requests settle (acknowledged or failed) within the message timeout.
        self._producer.flush(self.timing.message_timeout_s + self.timing.margin_s)
        self._reader.close()
        settled = len(self._producer) == 0
        try:
            with self.engine.begin() as conn:
                if settled:
                    conn.execute(_RELEASE, {"me": self.owner, "keep": []})
                conn.execute(_LEAVE, {"me": self.owner})
        except SQLAlchemyError as exc:
            log.warning("could not release leases of %s: %s", self.owner, exc)
        if not settled:
            log.warning(
                "relay %s leaves %d deliveries unsettled: its leases are left to run out",
                self.owner,
                len(self._producer),
            )
        self._shards, self._stamps, self._epochs = [], {}, {}
        self._window.clear()  # what was acknowledged and not deleted is published again
        self._deadline.lapse()
        # Shut the client down now: left to garbage collection, its threads go on
        # reconnecting (and logging) after the broker is gone.
        self._producer.close()

    # Publishing -------------------------------------------------------------------

    def _publish(self, rows: Sequence[Row], stop: threading.Event | None) -> Batch:
        """Produce ``rows`` in order while the leases allow; the batch joins the window
        of batches in flight (its deliveries are settled by ``_settle``)."""
        batch = Batch(rows=rows)
        self._window.append(batch)
        topic = self.settings.topic
        deadline = self._deadline
        clock = time.monotonic
        produce = self._producer.produce
        delivered = batch.delivered
        until = deadline.produce_until
        header = EVENT_ID_HEADER
        produced = 0
        try:
            for row in rows:
                # Read afresh per row: the heartbeat thread renews (or fences) meanwhile;
                # the deadline only when the one read last has passed.
                stamp = self._stamps.get(row[5])
                now = clock()
                if now >= until:
                    until = deadline.produce_until
                if stamp is None or now >= until:
                    # No lease valid long enough for this row's message to settle in
                    # time: it (and every later row) waits for the next renewal.
                    batch.cut = True
                    break
                headers: _Headers = [(header, row[2]), stamp]
                try:
                    produce(topic, row[3], row[1], on_delivery=delivered, headers=headers)
                except BufferError:
                    self._produce_when_room(topic, row, headers, batch)
                produced += 1
        finally:
            # Counted once: a report of this batch served meanwhile (inside a poll for
            # room) took its pending count down already.
            batch.produced = produced
            batch.pending += produced
        self._producer.poll(0)  # serve the deliveries of earlier batches
        return batch

    def _produce_when_room(self, topic: str, row: Row, headers: _Headers, batch: Batch) -> None:
        """Produce ``row`` once the local queue has room again."""
        while True:
            self._producer.poll(0.05)  # the local queue is full; let deliveries drain
            try:
                self._producer.produce(
                    topic,
                    value=row[3],
                    key=row[1],
                    on_delivery=batch.delivered,
                    headers=headers,
                )
                return
            except BufferError:
                continue

    def _settle(self, stop: threading.Event | None, *, keep: int) -> int:
        """Wait until at most ``keep`` batches are in flight, oldest first, then delete the
        rows Kafka acknowledged (fenced by the leases still held) and account.

        Every message settles within the message timeout (delivered, failed or purged).
        A batch with a failed delivery settles every later one too and the next read
        starts from the lowest id again: failed rows stay in the outbox and are read
        first, which keeps every run's order. Shutdown cuts the wait after a grace
        period. Returns the rows acknowledged, and at least 1 when rows were left.
        """
        window = self._window
        done: list[Batch] = []
        grace: float | None = None
        warned_at = time.monotonic()
        while len(window) > keep:
            batch = window[0]
            if batch.pending > 0:
                self._producer.poll(0.05)
                now = time.monotonic()
                if stop is not None and stop.is_set():
                    grace = grace or now + self.options.shutdown_grace_s
                    if now >= grace:
                        left = sum(b.pending for b in window)
                        log.warning("shutting down with %d deliveries unconfirmed", left)
                        for each in window:
                            each.settle()
                        done.extend(window)
                        window.clear()
                        break
                if now - warned_at > 5.0:
                    warned_at = now
                    log.warning(
                        "waiting for Kafka at %s: %d deliveries in flight",
                        self.settings.kafka_bootstrap,
                        sum(b.pending for b in window),
                    )
                if not self._beating:
                    try:
                        self._keep_leases(may_release=False, wait=False)
                    except SQLAlchemyError as exc:
                        log.warning("could not renew leases: %s", first_line(exc))
                        self._next_check = now + self.timing.heartbeat_s / 2
                self._fence_if_expired("its leases could not be renewed before they ran out")
                continue
            done.append(window.popleft())
            batch.settle()
            if batch.left_rows:
                keep = 0
        if not window:
            self._reader.rewind()
        self._left_rows = any(b.left_rows for b in done)
        if not done:
            return 0
        acked = [row_id for b in done for row_id in b.acked]
        if acked:
            self._reader.delete(acked)
        self._counts.settled(done)
        return len(acked) or int(any(b.left_rows for b in done))

    def _fence_if_expired(self, reason: str) -> None:
        if self._shards and self._deadline.expired(time.monotonic()):
            with self._lease_lock:  # checked again: a renewal may have just finished
                if self._shards and self._deadline.expired(time.monotonic()):
                    self._fence(reason)

    def _fence(self, reason: str) -> None:
        """Stop producing at once and purge what is queued: the leases cannot be shown
        valid. The purged rows stay in the outbox for whichever relay holds them next.
        Called with the lease lock held."""
        queued = len(self._producer)
        self._producer.purge(in_queue=True, in_flight=False, blocking=True)
        purged = max(queued - len(self._producer), 0)
        self._counts.fenced_once(purged)
        log.warning(
            "relay %s stops publishing shards %s: %s; %d queued messages purged (their rows "
            "stay for the next owner)",
            self.owner,
            self._shards,
            reason,
            purged,
        )
        self._shards, self._stamps, self._epochs = [], {}, {}
        self._deadline.lapse()
        self._next_check = -math.inf

    # Leases -----------------------------------------------------------------------

    def rebalance(self) -> list[int]:
        """Heartbeat, renew leases and take or hand back shards to hold a fair share now.

        The loop does this by itself every heartbeat; the shards held afterwards are
        returned.
        """
        self._next_check = -math.inf
        self._reader.collect(wait=True)
        self._keep_leases(may_release=self._quiet())
        return list(self._shards)

    def _keep_leases(self, *, may_release: bool, wait: bool = True) -> None:
        """Heartbeat and renew when due; claim or (with ``may_release``, when nothing is
        queued) hand back shards towards a fair share. Without ``wait`` nothing is done
        while another thread renews (the loop does not stall behind the heartbeat)."""
        if time.monotonic() < self._next_check:
            return
        if not self._lease_lock.acquire(blocking=wait):
            return
        try:
            self._renew_if_due(may_release=may_release)
        finally:
            self._lease_lock.release()

    def _renew_if_due(self, *, may_release: bool) -> None:
        started = time.monotonic()
        if started < self._next_check:
            return
        shards = self.settings.outbox_shards
        params = {"me": self.owner, "ttl": self.timing.ttl_s, "shards": shards}
        with self.engine.begin() as conn:
            conn.execute(_BOUNDED, self._idle_bound)
            if not self._seeded:
                conn.execute(_SEED_LEASES, {"shards": shards})
            conn.execute(_HEARTBEAT, params)
            held = {int(s): int(e) for s, e in conn.execute(_RENEW, params)}
            lost = sorted(set(self._shards) - held.keys())
            peers = int(conn.execute(_LIVE_PEERS, params).scalar_one())
            fair = math.ceil(shards / (1 + peers))
            self._over_share = len(held) > fair
            if len(held) > fair and may_release:
                # Hand shards back so a relay that just started gets its share.
                keep = sorted(held)[:fair]
                conn.execute(_RELEASE, {"me": self.owner, "keep": keep})
                held = {s: held[s] for s in keep}
                self._over_share = False
            elif len(held) < fair:
                claimed = conn.execute(_CLAIM, {**params, "wanted": fair - len(held)})
                held.update({int(s): int(e) for s, e in claimed})
            soonest = conn.execute(_SOONEST_FOREIGN, params).scalar_one()
        self._seeded = True
        if lost:
            # Another relay holds them now (or they ran out): whatever is queued may
            # belong to them, so nothing queued may be sent.
            self._fence(f"shards {lost} are no longer its own")
        if sorted(held) != self._shards or held != self._epochs:
            log.info("relay %s now owns shards %s (epochs %s)", self.owner, sorted(held), held)
        self._shards = sorted(held)
        self._epochs = held
        self._stamps = {s: LeaseStamp(s, e).header() for s, e in held.items()}
        if held:
            self._deadline.renewed(started)
        else:
            self._deadline.lapse()
        self._next_check = started + self.timing.heartbeat_s
        if soonest is not None:
            # Look again the moment another relay's lease runs out: if it died, its
            # heartbeat ran out with it and its shards are ours to share.
            self._next_check = min(self._next_check, started + float(soonest) + 0.01)

    # Idle -------------------------------------------------------------------------

    def _wait_for_work(self, stop: threading.Event) -> None:
        """Sleep until a writer's NOTIFY or the polling interval, whichever comes first;
        the heartbeat thread renews the leases meanwhile. Shards the heartbeat took, or
        a share to hand back, end the wait early."""
        before = self._shards

        def moved() -> bool:
            return self._shards != before or self._over_share

        self._listener.wait(stop, timeout=self.options.idle_wait_s, moved=moved)
