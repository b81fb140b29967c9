"""What the relay has done, as totals on the relay and as its Prometheus metrics.

One place turns settled batches, fences and the outbox's backlog into counts, metrics
and the log lines that report trouble (deliveries timed out, events out of order).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from sqlalchemy import Engine

from agent_blackbox.outbox._postgres import outbox_backlog_txn
from agent_blackbox.outbox.relay._batch import Batch, order_gaps
from agent_blackbox.outbox.relay._log import log
from agent_blackbox.outbox.relay._metrics import RelayMetrics


class RelayCounts:
    """The relay's totals and metrics.

    Args:
        metrics: where the metrics go.
        message_timeout_s: the producer's message timeout, named when deliveries time out.
        kafka_bootstrap: the brokers, named likewise.
        depth_every_s: how often the outbox's depth is looked at, at most.
    """

    def __init__(
        self,
        metrics: RelayMetrics,
        *,
        message_timeout_s: float,
        kafka_bootstrap: str,
        depth_every_s: float,
    ) -> None:
        self.metrics = metrics
        self._message_timeout_s = message_timeout_s
        self._kafka_bootstrap = kafka_bootstrap
        self._depth_every_s = depth_every_s
        self._depth_at = -math.inf
        self.published = 0
        self.failed_deliveries = 0
        """Deliveries Kafka refused since the relay started (their rows stay)."""
        self.timed_out = 0
        """Deliveries not settled within the message timeout (their rows stay)."""
        self.fenced = 0
        """Times the relay stopped publishing for want of a valid lease."""

    def settled(self, batches: Sequence[Batch]) -> None:
        """Count the batches that just settled, and the events of a run that Kafka
        acknowledged after an earlier one of theirs failed."""
        for batch in batches:
            self._account(batch)
        if any(b.failed for b in batches):
            rows = [row for b in batches for row in b.rows[: b.produced]]
            acked = [row_id for b in batches for row_id in b.acked]
            failed = [row_id for b in batches for row_id in b.failed]
            self._count_order_gaps(order_gaps(rows, acked, failed))

    def batch_took(self, seconds: float) -> None:
        """A batch was read, produced and (as far as the pipeline waits) settled."""
        self.metrics.batch_seconds.observe(seconds)

    def fenced_once(self, purged: int) -> None:
        """The relay stopped publishing and purged ``purged`` queued messages."""
        self.fenced += 1
        self.metrics.fenced.inc()
        self.metrics.purged.inc(purged)

    def observe_depth(self, engine: Engine) -> None:
        """Look at the outbox's backlog, when the last look is old enough."""
        now = time.monotonic()
        if now - self._depth_at < self._depth_every_s:
            return
        self._depth_at = now
        with engine.connect() as conn:
            depth, oldest = outbox_backlog_txn(conn)
        self.metrics.outbox_depth.set(depth)
        self.metrics.outbox_oldest_age.set(oldest)

    def _account(self, batch: Batch) -> None:
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
                self._message_timeout_s,
                self._kafka_bootstrap,
            )

    def _count_order_gaps(self, gaps: int) -> None:
        if gaps:
            self.metrics.order_gaps.inc(gaps)
            log.error(
                "%d events were acknowledged after an earlier event of their run failed; "
                "the earlier ones follow them in the topic (readers order by sequence)",
                gaps,
            )


def _age(created_at: float) -> float:
    """Seconds since ``created_at`` (epoch seconds, the database's clock)."""
    return max(time.time() - created_at, 0.0)
