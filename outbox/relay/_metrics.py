"""Prometheus metrics of the relay."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class RelayMetrics:
    """The relay's metrics, registered in one registry per relay."""

    registry: CollectorRegistry
    outbox_depth: Gauge
    outbox_oldest_age: Gauge
    published: Counter
    delivery_failures: Counter
    publish_latency: Histogram
    batch_seconds: Histogram
    fenced: Counter
    purged: Counter
    delivery_timeouts: Counter
    order_gaps: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> RelayMetrics:
        """Metrics in ``registry`` (a fresh one when omitted)."""
        registry = registry or CollectorRegistry()
        return cls(
            registry=registry,
            outbox_depth=Gauge(
                "blackbox_outbox_depth", "Rows waiting in the outbox", registry=registry
            ),
            outbox_oldest_age=Gauge(
                "blackbox_outbox_oldest_age_seconds",
                "How long the oldest row in the outbox has waited (0 when it is empty)",
                registry=registry,
            ),
            published=Counter(
                "blackbox_events_published", "Events acknowledged by Kafka", registry=registry
            ),
            delivery_failures=Counter(
                "blackbox_delivery_failures",
                "Deliveries Kafka refused; their rows stay in the outbox",
                registry=registry,
            ),
            publish_latency=Histogram(
                "blackbox_publish_latency_seconds",
                "From outbox commit to Kafka acknowledgement",
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
                registry=registry,
            ),
            batch_seconds=Histogram(
                "blackbox_relay_batch_seconds",
                "Read, produce, acknowledge and delete of one batch",
                registry=registry,
            ),
            fenced=Counter(
                "blackbox_relay_fenced",
                "Times the relay stopped publishing: a lease lost or not renewed in time",
                registry=registry,
            ),
            purged=Counter(
                "blackbox_relay_purged_messages",
                "Queued messages purged when the relay fenced itself; their rows stay",
                registry=registry,
            ),
            delivery_timeouts=Counter(
                "blackbox_delivery_timeouts",
                "Deliveries not settled within the message timeout (Kafka slow or away); "
                "their rows stay and are published again in order",
                registry=registry,
            ),
            order_gaps=Counter(
                "blackbox_relay_order_gaps",
                "Events acknowledged after an earlier event of their run timed out: the "
                "earlier one is published again after them",
                registry=registry,
            ),
        )
