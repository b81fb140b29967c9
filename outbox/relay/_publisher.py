"""Producing a batch of outbox rows to Kafka, and waiting for its delivery reports.

The publisher owns the relay's producer and its window of batches in flight, oldest
first. A row is produced only while its shard's lease is valid long enough for the
message to settle before the lease can move (``LeaseDeadline.produce_until``), stamped
with the lease's epoch beside the event id. A run has at most one message in the
producer: its next row is held until Kafka acknowledged that one, and produced after the
poll that served the acknowledgement, under the same lease rule (``_run_order`` says why
this keeps every run's order whatever fails). Batches overlap: the next one is produced
while the reports of the one before still arrive, and a batch is settled once every row
of it was reported or dropped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaException

from agent_blackbox.broker import new_producer, producer_config
from agent_blackbox.outbox.relay._batch import Batch, Row
from agent_blackbox.outbox.relay._lease import LeaseDeadline, LeaseTiming
from agent_blackbox.outbox.relay._log import first_line, log
from agent_blackbox.outbox.relay._run_order import RunOrder
from agent_blackbox.schemas import Settings

EVENT_ID_HEADER = "blackbox.event_id"

_Headers = list[tuple[str, str | bytes | None]]


class Leases(Protocol):
    """What producing needs of the relay's leases, read afresh for every row."""

    @property
    def stamps(self) -> Mapping[int, tuple[str, bytes]]:
        """Each held shard's ``LeaseStamp`` header."""
        ...

    @property
    def deadline(self) -> LeaseDeadline:
        """Until when the leases can be shown valid."""
        ...


class Publisher:
    """The relay's producer and the batches it has in flight.

    Args:
        settings: the topic and the Kafka bootstrap.
        timing: the lease's timing; the producer's message timeout is derived from it.
        overrides: extra librdkafka settings.
        shutdown_grace_s: how long a stop request still waits for deliveries in flight.

    Raises:
        ValueError: ``overrides`` sets ``message.timeout.ms``.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        timing: LeaseTiming,
        overrides: Mapping[str, Any],
        shutdown_grace_s: float,
    ) -> None:
        if "message.timeout.ms" in overrides:
            raise ValueError(
                "message.timeout.ms is derived from the lease TTL (half of it) so that "
                "nothing queued outlives a lease; change the lease TTL instead"
            )
        self._topic = settings.topic
        self._kafka_bootstrap = settings.kafka_bootstrap
        self._timing = timing
        self._shutdown_grace_s = shutdown_grace_s
        self._producer = new_producer(
            settings,
            producer_config(settings, message_timeout_ms=timing.message_timeout_ms, **overrides),
            logger=logging.getLogger("blackbox.relay.librdkafka"),
        )
        self._window: deque[Batch] = deque()
        """Batches produced and not yet settled, oldest first."""
        self._order = RunOrder()
        self._refused_runs: set[str] = set()
        """Runs a message of which the producer refused (said once each)."""
        self.refusals = 0
        """Messages the producer refused outright, each time it did."""
        self._leases: Leases | None = None
        """The leases the last batch was produced under; held rows are produced under
        them too, when their turn comes."""

    @property
    def batches_in_flight(self) -> int:
        """Batches produced and not yet settled."""
        return len(self._window)

    @property
    def rows_in_flight(self) -> int:
        """Rows produced and not yet settled: they are still in the outbox."""
        return sum(b.produced for b in self._window)

    @property
    def queued(self) -> int:
        """Messages the producer holds: queued, or sent and not yet reported."""
        return len(self._producer)

    def publish(self, rows: Sequence[Row], leases: Leases) -> Batch:
        """Take ``rows`` in order while ``leases`` allow: each is produced, or held
        behind its run's message in the producer (``RunOrder``); the batch joins the
        window of batches in flight (its deliveries are settled by ``settle``)."""
        order = self._order
        batch = Batch(rows=rows, order=order)
        self._window.append(batch)
        self._leases = leases
        topic = self._topic
        deadline = leases.deadline
        clock = time.monotonic
        produce = self._producer.produce
        delivered = batch.delivered
        open_runs, stopped, hold = order.open, order.stopped, order.hold
        until = deadline.produce_until
        header = EVENT_ID_HEADER
        produced = 0
        try:
            for row in rows:
                key = row[1]
                if key in open_runs or key in stopped:
                    hold(row, batch)  # behind its run's message in the producer, or left
                    produced += 1
                    continue
                # Read afresh per row: the heartbeat thread renews (or fences) meanwhile;
                # the deadline only when the one read last has passed.
                stamp = leases.stamps.get(row[5])
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
                    produce(topic, row[3], key, on_delivery=delivered, headers=headers)
                except BufferError:
                    self._produce_when_room(topic, row, headers, batch)
                except KafkaException as exc:
                    self._refused(row, batch, exc)
                    produced += 1
                    continue
                open_runs[key] = None  # its run's next row waits for the report
                produced += 1
                if clock() >= until:
                    until = deadline.produce_until  # renewed meanwhile, or not
                    if clock() >= until:
                        # The process stood still between the check and the produce (a
                        # SIGSTOP, a VM pause): the message's timeout started only now.
                        self._produced_late()
                        batch.cut = True
                        break
        finally:
            # Counted once: a report of this batch served meanwhile (inside a poll for
            # room) took its pending count down already, and so did a row left.
            batch.produced = produced
            batch.pending += produced
        self._poll(0)  # serve the deliveries of earlier batches
        return batch

    def settle(
        self, stop: threading.Event | None, *, keep: int, waiting: Callable[[], None]
    ) -> list[Batch]:
        """Wait until at most ``keep`` batches are in flight, oldest first; the batches
        settled, their rows sorted into acknowledged and failed.

        Every message settles within the message timeout (delivered, failed or purged).
        A batch that left rows in the outbox settles every later one too: the next read
        starts from the lowest id again, which keeps every run's order. Shutdown (``stop``
        set) cuts the wait after a grace period. ``waiting`` is called between polls
        (the leases are kept meanwhile).
        """
        window = self._window
        done: list[Batch] = []
        grace: float | None = None
        warned_at = time.monotonic()
        while len(window) > keep:
            batch = window[0]
            if batch.pending > 0:
                self._poll(0.05)
                now = time.monotonic()
                if stop is not None and stop.is_set():
                    grace = grace or now + self._shutdown_grace_s
                    if now >= grace:
                        left = sum(b.pending for b in window)
                        log.warning("shutting down with %d deliveries unconfirmed", left)
                        for each in window:
                            each.settle()
                        done.extend(window)
                        window.clear()
                        self._order = RunOrder()  # what it held stays in the outbox
                        break
                if now - warned_at > 5.0:
                    warned_at = now
                    log.warning(
                        "waiting for Kafka at %s: %d deliveries in flight",
                        self._kafka_bootstrap,
                        sum(b.pending for b in window),
                    )
                waiting()
                continue
            done.append(window.popleft())
            batch.settle()
            if batch.left_rows:
                keep = 0
        if not window:
            self._order.settled()
        return done

    def purge(self) -> int:
        """Drop what is queued and not yet sent (the relay may no longer publish it);
        how many messages were dropped. Their reports come back failed (purged)."""
        queued = len(self._producer)
        self._producer.purge(in_queue=True, in_flight=False, blocking=True)
        return max(queued - len(self._producer), 0)

    def wind_down(self) -> None:
        """Drop what is queued and wait, within the message timeout, for the requests
        already sent to settle (acknowledged or failed)."""
        self._producer.purge(in_queue=True, in_flight=False, blocking=True)
        self._producer.flush(self._timing.message_timeout_s + self._timing.margin_s)

    def close(self) -> None:
        """Forget the batches in flight (what was acknowledged and not deleted is
        published again) and shut the producer down."""
        self._window.clear()
        self._order = RunOrder()
        # Shut the client down now: left to garbage collection, its threads go on
        # reconnecting (and logging) after the broker is gone.
        self._producer.close()

    def _poll(self, timeout: float) -> None:
        """Serve delivery reports, then produce the rows they released."""
        self._producer.poll(timeout)
        if self._order.ready:
            self._release()

    def _release(self) -> None:
        """Produce the rows whose run's previous message was just acknowledged, under the
        rule every row is produced under: a lease valid long enough for the message to
        settle. A row whose turn comes too late is left, and its run stopped."""
        order, leases = self._order, self._leases
        produce, topic, header = self._producer.produce, self._topic, EVENT_ID_HEADER
        while order.ready:
            ready, order.ready = order.ready, []
            # Read once a round, as ``publish`` reads them once a row: a round is what
            # one poll released, produced within microseconds.
            stamps = {} if leases is None else leases.stamps
            until = -math.inf if leases is None else leases.deadline.produce_until
            late = time.monotonic() >= until
            for row, batch in ready:
                stamp = stamps.get(row[5])
                if late or stamp is None:
                    batch.drop(row)
                    order.stop(row[1])
                    continue
                headers: _Headers = [(header, row[2]), stamp]
                try:
                    produce(topic, row[3], row[1], on_delivery=batch.delivered, headers=headers)
                except BufferError:
                    self._produce_when_room(topic, row, headers, batch)
                except KafkaException as exc:
                    self._refused(row, batch, exc)
                # Its run stays open: the acknowledgement that released it left it so.
                if time.monotonic() >= until and leases is not None:
                    until = leases.deadline.produce_until  # renewed meanwhile, or not
                    if time.monotonic() >= until:
                        late = True  # as in ``publish``: it stood still before the produce
                        self._produced_late()

    def _refused(self, row: Row, batch: Batch, exc: KafkaException) -> None:
        """The producer refused ``row``'s message outright (larger than the topic takes,
        say): it stays in the outbox and its run is stopped, so the run's order holds
        and every other run goes on; said once per run, as an error to act on."""
        self.refusals += 1
        batch.drop(row)
        self._order.stop(row[1])
        run = row[1].decode("utf-8", "replace")
        if run not in self._refused_runs:
            self._refused_runs.add(run)
            log.error(
                "the producer refused event %s of run %s (%s, %d bytes): the run's events "
                "stay in the outbox and wait, the other runs' go on. An event recorded "
                "before its size was capped: to send it, raise the topic's and the "
                "producer's message size (message.max.bytes)",
                row[2].decode("utf-8", "replace"),
                run,
                first_line(exc),
                len(row[3]),
            )

    def _produced_late(self) -> None:
        """A message was handed to the producer after its lease's last moment for it
        (the process stood still between the check and the produce, and the message's
        timeout started only then): purge what is queued before it is sent. The purged
        rows stay in the outbox and are read again from the lowest id."""
        purged = self.purge()
        log.warning(
            "the relay stood still while producing; %d queued messages purged (their rows "
            "stay for the next read)",
            purged,
        )

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
