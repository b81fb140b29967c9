"""The outbox relay: publishes committed events to Kafka in order, then deletes them.

Guarantees rest on three rules. A run lives on one shard and a shard is read in id
order, so a run's events are produced in sequence order; the idempotent producer keeps
that order on the partition across retries. A row is deleted only after its delivery
report succeeded, so nothing committed is lost. A shard is read by the one relay that
holds its lease, and deletes are fenced by that lease.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Message
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import KafkaUnavailable, ensure_topics, new_producer, producer_config
from agent_blackbox.outbox._postgres import pending_events_txn
from agent_blackbox.outbox._tables import NOTIFY_CHANNEL
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
_RENEW = text(
    "UPDATE blackbox.relay_leases SET expires_at = now() + make_interval(secs => :ttl) "
    "WHERE owner = :me AND shard < :shards RETURNING shard"
)
_CLAIM = text(
    """
    UPDATE blackbox.relay_leases SET owner = :me, expires_at = now() + make_interval(secs => :ttl)
     WHERE shard IN (
        SELECT shard FROM blackbox.relay_leases
         WHERE shard < :shards AND (owner IS NULL OR expires_at < now())
         ORDER BY shard LIMIT :wanted FOR UPDATE SKIP LOCKED)
    RETURNING shard
    """
)
_RELEASE = text(
    "UPDATE blackbox.relay_leases SET owner = NULL, expires_at = NULL "
    "WHERE owner = :me AND (:keep_all OR NOT shard = ANY(:keep))"
)
_READ = text(
    "SELECT id, run_id, event_id::text, envelope, created_at FROM blackbox.outbox "
    "WHERE shard = ANY(:shards) ORDER BY id LIMIT :limit"
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
    lease_ttl_s: float = 10.0
    idle_wait_s: float = 1.0
    """Longest wait for a notification before polling the outbox anyway."""
    shutdown_grace_s: float = 10.0
    """How long SIGTERM waits for deliveries in flight."""
    depth_every_s: float = 5.0


@dataclass(slots=True)
class _Batch:
    rows: Sequence[Any]
    acked: list[int] = field(default_factory=list)
    failed: int = 0
    pending: int = 0


class Relay:
    """Drains the outbox shards this relay leases into the events topic.

    Args:
        engine: the write side's database.
        settings: topic, partitions, shard count, Kafka bootstrap.
        owner: this relay's lease owner id; ``host:pid`` by default.
        metrics: where the metrics go (a fresh registry by default).
        producer_overrides: extra librdkafka settings.
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
        self.metrics = metrics or RelayMetrics.create()
        self._producer = new_producer(
            self.settings,
            producer_config(self.settings, **(producer_overrides or {})),
            logger=logging.getLogger("blackbox.relay.librdkafka"),
        )
        self._shards: list[int] = []
        self._renewed_at = -math.inf
        self._depth_at = -math.inf
        self._listener: psycopg.Connection[Any] | None = None
        self._topic_ready = False
        self._closed = False
        self.idle = False
        """True while the relay waits for a notification (nothing left to publish)."""
        self.published = 0
        self.failed_deliveries = 0
        """Deliveries Kafka refused since the relay started (their rows stay)."""

    # Loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set; in-flight deliveries finish before returning.

        A database or Kafka that is away is retried with backoff.

        Raises:
            PermissionRefused: the database refused the session user (not the relay's
                role): retrying cannot help, so the relay stops at once.
        """
        failures = 0
        try:
            while not stop.is_set():
                refused = self.failed_deliveries
                try:
                    moved = self.drain_once(stop)
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
                failures = 0
                if moved == 0:
                    self._wait_for_work(stop)
        finally:
            self.close()

    def drain_once(self, stop: threading.Event | None = None) -> int:
        """Publish one batch from the leased shards; the number of rows it moved."""
        self._keep_leases()
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
                conn.execute(_DELETE, {"ids": batch.acked, "me": self.owner})
        self.published += len(batch.acked)
        self.metrics.published.inc(len(batch.acked))
        # One latency sample per batch: its oldest row, the worst case of the batch.
        self.metrics.publish_latency.observe(_age(rows[0][4]))
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        return len(batch.acked)

    def drain(self, *, timeout: float = 60.0) -> int:
        """Publish until the leased shards are empty or ``timeout`` passes (for tools)."""
        deadline = time.monotonic() + timeout
        total = 0
        while time.monotonic() < deadline:
            moved = self.drain_once()
            total += moved
            if moved == 0 and self._shards:
                return total
        return total

    def close(self) -> None:
        """Release leases and stop listening; queued deliveries are abandoned (their rows
        stay in the outbox for the next relay). Closing again does nothing; a closed
        relay publishes no more."""
        if self._closed:
            return
        self._closed = True
        self._close_listener()
        try:
            with self.engine.begin() as conn:
                conn.execute(_RELEASE, {"me": self.owner, "keep_all": False, "keep": []})
                conn.execute(_LEAVE, {"me": self.owner})
        except SQLAlchemyError as exc:
            log.warning("could not release leases of %s: %s", self.owner, exc)
        self._shards = []
        self._producer.purge()
        self._producer.flush(0)
        # Shut the client down now: left to garbage collection, its threads go on
        # reconnecting (and logging) after the broker is gone.
        self._producer.close()

    # Publishing -------------------------------------------------------------------

    def _publish(self, rows: Sequence[Any], stop: threading.Event | None) -> _Batch:
        batch = _Batch(rows=rows, pending=len(rows))
        topic = self.settings.topic
        for row in rows:
            self._produce(topic, row, batch)
        self._await_deliveries(batch, stop)
        return batch

    def _produce(self, topic: str, row: Any, batch: _Batch) -> None:
        row_id, run_id, event_id, envelope, _ = row

        # Kept minimal: it runs once per event, inside poll().
        def delivered(err: KafkaError | None, msg: Message) -> None:
            batch.pending -= 1
            if err is None:
                batch.acked.append(row_id)
            else:
                batch.failed += 1
                self.failed_deliveries += 1
                self.metrics.delivery_failures.inc()
                log.error("delivery of event %s (run %s) failed: %s", event_id, run_id, err)

        while True:
            try:
                self._producer.produce(
                    topic,
                    key=run_id.encode("utf-8"),
                    value=envelope,
                    headers=[(EVENT_ID_HEADER, event_id.encode("ascii"))],
                    on_delivery=delivered,
                )
                return
            except BufferError:
                self._producer.poll(0.05)  # the local queue is full; let deliveries drain

    def _await_deliveries(self, batch: _Batch, stop: threading.Event | None) -> None:
        # The message timeout is unlimited, so an outage keeps us here until the broker
        # is back: rows stay in the outbox and later batches are not read, which keeps
        # every run's order. Only shutdown cuts the wait, after a grace period.
        deadline: float | None = None
        warned_at = time.monotonic()
        while batch.pending > 0:
            self._producer.poll(0.1)
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
            self._keep_leases()

    # Leases -----------------------------------------------------------------------

    def rebalance(self) -> list[int]:
        """Heartbeat, renew leases and take or hand back shards to hold a fair share now.

        The loop does this by itself every third of the lease time; the shards held
        afterwards are returned.
        """
        self._renewed_at = -math.inf
        self._keep_leases()
        return list(self._shards)

    def _keep_leases(self) -> None:
        now = time.monotonic()
        if now - self._renewed_at < self.options.lease_ttl_s / 3:
            return
        shards = self.settings.outbox_shards
        params = {"me": self.owner, "ttl": self.options.lease_ttl_s, "shards": shards}
        with self.engine.begin() as conn:
            conn.execute(_SEED_LEASES, {"shards": shards})
            conn.execute(_HEARTBEAT, params)
            held = sorted(r[0] for r in conn.execute(_RENEW, params))
            fair = math.ceil(shards / (1 + int(conn.execute(_LIVE_PEERS, params).scalar_one())))
            if len(held) > fair:
                # Hand shards back so a relay that just started gets its share.
                held = held[:fair]
                conn.execute(_RELEASE, {"me": self.owner, "keep_all": False, "keep": held})
            elif len(held) < fair:
                claimed = conn.execute(_CLAIM, {**params, "wanted": fair - len(held)})
                held = sorted(held + [r[0] for r in claimed])
        if held != self._shards:
            log.info("relay %s now owns shards %s", self.owner, held)
        self._shards = held
        self._renewed_at = now

    # Idle -------------------------------------------------------------------------

    def _wait_for_work(self, stop: threading.Event) -> None:
        """Sleep until a writer's NOTIFY or the polling interval, whichever comes first.

        The wait is cut in short slices so that a stop request is seen promptly.
        """
        deadline = time.monotonic() + self.options.idle_wait_s
        try:
            listener = self._listen()
            self.idle = True
            while not stop.is_set() and (remaining := deadline - time.monotonic()) > 0:
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


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _age(created_at: datetime) -> float:
    return max((datetime.now(UTC) - created_at).total_seconds(), 0.0)
