"""The outbox relay: publishes committed events to Kafka in order, then deletes them.

Guarantees rest on four rules. A run lives on one shard and a shard is read in id
order, so a run's events are produced in sequence order; the idempotent producer keeps
that order on the partition across retries. A row is deleted only after its delivery
report succeeded, so nothing committed is lost. A shard is read by the one relay that
holds its lease, and deletes are fenced by that lease. And a relay publishes only under
a lease it can show valid, stamping each message with the lease's epoch.

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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Message
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import (
    KafkaUnavailable,
    LeaseStamp,
    ensure_topics,
    new_producer,
    producer_config,
)
from agent_blackbox.outbox._postgres import pending_events_txn
from agent_blackbox.outbox._tables import NOTIFY_CHANNEL
from agent_blackbox.outbox.relay._lease import LeaseDeadline, LeaseTiming
from agent_blackbox.outbox.relay._metrics import RelayMetrics
from agent_blackbox.schemas import PermissionRefused, Settings, permission_refused

log = logging.getLogger("blackbox.relay")

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
_READ = text(
    "SELECT id, run_id, event_id::text, envelope, created_at, shard FROM blackbox.outbox "
    "WHERE shard = ANY(:shards) ORDER BY id LIMIT :limit"
)
# Every transaction of the relay that takes row locks (lease renewal and claims, deletes)
# bounds how long it may sit idle: a relay frozen inside one (SIGSTOP, a VM pause) would
# otherwise hold its lease rows, so no other relay could claim them (the claim skips
# locked rows), or its outbox rows, so the next owner's deletes would wait. The server
# ends such a session after the bound, well before the frozen relay's leases run out.
_BOUNDED = text("SELECT set_config('idle_in_transaction_session_timeout', :idle_ms, true)")
_ASYNC_COMMIT = text(
    "SELECT set_config('idle_in_transaction_session_timeout', :idle_ms, true), "
    "set_config('synchronous_commit', 'off', true)"
)
# Fenced by the leases this relay still holds. The lease set is computed once, as an
# array, so the planner probes the primary key per id instead of per id and lease.
_DELETE = text(
    """
    DELETE FROM blackbox.outbox
     WHERE id = ANY(:ids)
       AND shard = ANY(ARRAY(SELECT shard FROM blackbox.relay_leases WHERE owner = :me))
    """
)


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


@dataclass(slots=True)
class _Batch:
    rows: Sequence[Any]
    acked: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    refused: int = 0
    timed_out: int = 0
    purged: int = 0
    pending: int = 0
    cut: bool = False
    """Rows were left unproduced: the lease deadline came first."""


_TIMED_OUT = KafkaError._MSG_TIMED_OUT
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


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
        ValueError: lease timing that cannot work, or a message timeout override.
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
        overrides = dict(producer_overrides or {})
        if "message.timeout.ms" in overrides:
            raise ValueError(
                "message.timeout.ms is derived from the lease TTL (half of it) so that "
                "nothing queued outlives a lease; change the lease TTL instead"
            )
        self.metrics = metrics or RelayMetrics.create()
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
        self._epochs: dict[int, int] = {}
        self._next_check = -math.inf
        self._over_share = False
        self._seeded = False
        # Lease state is renewed by a heartbeat thread while the loop publishes (see
        # _heartbeats); the lock keeps one renewal or fence at a time.
        self._lease_lock = threading.RLock()
        self._depth_at = -math.inf
        self._listener: psycopg.Connection[Any] | None = None
        self._topic_ready = False
        self._closed = False
        self.idle = False
        """True while the relay waits for a notification (nothing left to publish)."""
        self.published = 0
        self.failed_deliveries = 0
        """Deliveries Kafka refused since the relay started (their rows stay)."""
        self.timed_out = 0
        """Deliveries not settled within the message timeout (their rows stay)."""
        self.fenced = 0
        """Times the relay stopped publishing for want of a valid lease."""

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
                if self.drain_once(stop) == 0:
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
                log.warning("%s; retrying in %.1fs", _first_line(exc), delay)
                self._close_listener()
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
                    log.warning("could not renew leases: %s", _first_line(exc))
                    self._next_check = time.monotonic() + self.timing.heartbeat_s / 2
                self._fence_if_expired("its leases could not be renewed before they ran out")

        thread = threading.Thread(target=beat, name=f"heartbeat {self.owner}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=30)

    def drain_once(self, stop: threading.Event | None = None) -> int:
        """Publish one batch from the leased shards: the number of rows it published, and
        at least 1 when it read rows it had to leave in the outbox (0: nothing to do)."""
        if self._over_share and len(self._producer) == 0:
            self._next_check = -math.inf  # hand shards back now, nothing is queued
        self._keep_leases(may_release=len(self._producer) == 0, wait=False)
        self._fence_if_expired("its leases ran out before they were renewed")
        self._observe_depth()
        if not self._shards:
            return 0
        if not self._topic_ready:
            ensure_topics(self.settings, {self.settings.topic: self.settings.partitions})
            self._topic_ready = True
        started = time.perf_counter()
        with self.engine.connect() as conn:
            rows = conn.execute(
                _READ, {"shards": self._shards, "limit": self.options.batch_size}
            ).all()
        if not rows:
            return 0
        batch = self._publish(rows, stop)
        if batch.acked:
            with self.engine.begin() as conn:
                # The next batch need not wait for this commit to reach the disk: a
                # delete lost in a database crash only publishes those rows again
                # (duplicates, which readers absorb), never loses one.
                conn.execute(_ASYNC_COMMIT, self._idle_bound)
                conn.execute(_DELETE, {"ids": batch.acked, "me": self.owner})
        self._account(batch)
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        if batch.cut:
            self._next_check = -math.inf  # renew before the next batch
        # Rows read but left (cut, failed) are no idle outbox: report at least one.
        return len(batch.acked) or int(batch.cut or bool(batch.failed))

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
                    return total
        return total

    def close(self) -> None:
        """Stop listening, purge what is still queued and hand the leases back once
        nothing is in flight (else they run out by themselves); purged rows stay in the
        outbox for the next relay. Closing again does nothing; a closed relay publishes
        no more."""
        if self._closed:
            return
        self._closed = True
        self._close_listener()
        self._producer.purge(in_queue=True, in_flight=False, blocking=True)
        # In-flight requests settle (acknowledged or failed) within the message timeout.
        self._producer.flush(self.timing.message_timeout_s + self.timing.margin_s)
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
        self._deadline.lapse()
        # Shut the client down now: left to garbage collection, its threads go on
        # reconnecting (and logging) after the broker is gone.
        self._producer.close()

    # Publishing -------------------------------------------------------------------

    def _publish(self, rows: Sequence[Any], stop: threading.Event | None) -> _Batch:
        batch = _Batch(rows=rows)
        topic = self.settings.topic
        deadline = self._deadline
        clock = time.monotonic
        for row in rows:
            # Read afresh per row: the heartbeat thread renews (or fences) meanwhile.
            stamp = self._stamps.get(row[5])
            if stamp is None or clock() >= deadline.produce_until:
                # No lease valid long enough for this row's message to settle in time:
                # it (and every later row) waits for the next renewal.
                batch.cut = True
                break
            self._produce(topic, row, stamp, batch)
        self._await_deliveries(batch, stop)
        return batch

    def _produce(self, topic: str, row: Any, stamp: tuple[str, bytes], batch: _Batch) -> None:
        row_id, run_id, event_id, envelope, _, _ = row

        # Kept minimal: it runs once per event, inside poll().
        def delivered(err: KafkaError | None, msg: Message) -> None:
            batch.pending -= 1
            if err is None:
                batch.acked.append(row_id)
                return
            batch.failed.append(row_id)
            code = err.code()
            if code == _TIMED_OUT:
                batch.timed_out += 1
            elif code in _PURGED:
                batch.purged += 1
            else:
                batch.refused += 1
                log.error("delivery of event %s (run %s) failed: %s", event_id, run_id, err)

        while True:
            try:
                self._producer.produce(
                    topic,
                    key=run_id.encode("utf-8"),
                    value=envelope,
                    headers=[(EVENT_ID_HEADER, event_id.encode("ascii")), stamp],
                    on_delivery=delivered,
                )
                batch.pending += 1
                return
            except BufferError:
                self._producer.poll(0.05)  # the local queue is full; let deliveries drain

    def _await_deliveries(self, batch: _Batch, stop: threading.Event | None) -> None:
        # Every message settles within the message timeout (delivered, failed or
        # purged); failed rows stay in the outbox and later batches read them first,
        # which keeps every run's order. Shutdown cuts the wait after a grace period.
        deadline: float | None = None
        warned_at = time.monotonic()
        while batch.pending > 0:
            self._producer.poll(0.05)
            now = time.monotonic()
            if stop is not None and stop.is_set():
                deadline = deadline or now + self.options.shutdown_grace_s
                if now >= deadline:
                    log.warning("shutting down with %d deliveries unconfirmed", batch.pending)
                    return
            if now - warned_at > 5.0:
                warned_at = now
                log.warning(
                    "waiting for Kafka at %s: %d deliveries in flight",
                    self.settings.kafka_bootstrap,
                    batch.pending,
                )
            try:
                self._keep_leases(may_release=False, wait=False)
            except SQLAlchemyError as exc:
                log.warning("could not renew leases: %s", _first_line(exc))
                self._next_check = now + self.timing.heartbeat_s / 2
            self._fence_if_expired("its leases could not be renewed before they ran out")

    def _account(self, batch: _Batch) -> None:
        self.published += len(batch.acked)
        self.metrics.published.inc(len(batch.acked))
        if batch.acked:
            # One latency sample per batch: its oldest row, the worst case of the batch.
            self.metrics.publish_latency.observe(_age(batch.rows[0][4]))
        if batch.refused:
            self.failed_deliveries += batch.refused
            self.metrics.delivery_failures.inc(batch.refused)
        if batch.timed_out:
            self.timed_out += batch.timed_out
            self.metrics.delivery_timeouts.inc(batch.timed_out)
            log.warning(
                "%d deliveries were not settled within %.1f s (is Kafka at %s reachable?); "
                "their rows stay and are published again in order",
                batch.timed_out,
                self.timing.message_timeout_s,
                self.settings.kafka_bootstrap,
            )
        gaps = order_gaps(batch.rows, batch.acked, batch.failed) if batch.failed else 0
        if gaps:
            self.metrics.order_gaps.inc(gaps)
            log.error(
                "%d events were acknowledged after an earlier event of their run failed; "
                "the earlier ones follow them in the topic (readers order by sequence)",
                gaps,
            )

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
        left = len(self._producer)
        self.fenced += 1
        self.metrics.fenced.inc()
        self.metrics.purged.inc(max(queued - left, 0))
        log.warning(
            "relay %s stops publishing shards %s: %s; %d queued messages purged (their rows "
            "stay for the next owner)",
            self.owner,
            self._shards,
            reason,
            max(queued - left, 0),
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
        self._keep_leases(may_release=len(self._producer) == 0)
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
        the heartbeat thread renews the leases meanwhile.

        The wait is cut in short slices so that a stop request, shards the heartbeat
        took, or a share to hand back are seen promptly.
        """
        deadline = time.monotonic() + self.options.idle_wait_s
        before = self._shards
        try:
            listener = self._listen()
            self.idle = True
            while not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._shards != before or self._over_share:
                    return
                for _ in listener.notifies(timeout=min(remaining, 0.25), stop_after=1):
                    return
        except psycopg.Error as exc:
            log.warning("LISTEN failed (%s); falling back to polling", exc)
            self._close_listener()
            stop.wait(max(deadline - time.monotonic(), 0.0))
        finally:
            self.idle = False

    def _listen(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed:
            url = self.engine.url.set(drivername="postgresql")
            dsn = url.render_as_string(hide_password=False)
            self._listener = psycopg.connect(dsn, autocommit=True)
            self._listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return self._listener

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _observe_depth(self) -> None:
        now = time.monotonic()
        if now - self._depth_at < self.options.depth_every_s:
            return
        self._depth_at = now
        with self.engine.connect() as conn:
            self.metrics.outbox_depth.set(pending_events_txn(conn))


def order_gaps(rows: Sequence[Any], acked: Sequence[int], failed: Sequence[int]) -> int:
    """How many acknowledged rows of ``rows`` (id, run id, ...; in id order) come after a
    failed row of their run: events the topic now holds before an earlier one of theirs."""
    failed_ids, acked_ids = set(failed), set(acked)
    first_failed: dict[str, int] = {}
    gaps = 0
    for row in rows:
        row_id, run_id = row[0], row[1]
        if row_id in failed_ids:
            first_failed.setdefault(run_id, row_id)
        elif row_id in acked_ids and run_id in first_failed:
            gaps += 1
    return gaps


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _age(created_at: datetime) -> float:
    return max((datetime.now(UTC) - created_at).total_seconds(), 0.0)
