"""Prometheus metrics of the backup writer."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class BackupMetrics:
    """What a backup writer exposes, in its own registry (``registry``)."""

    def __init__(self, *, topic: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ("topic",)
        self._lag = Gauge(
            "blackbox_backup_lag_messages",
            "Messages in the topic not yet in a written backup cut, per partition.",
            (*labels, "partition"),
            registry=self.registry,
        )
        self._cut_age = Gauge(
            "blackbox_backup_last_cut_timestamp_seconds",
            "When the newest backup cut was written (Unix time).",
            labels,
            registry=self.registry,
        )
        self._events = Counter(
            "blackbox_backup_messages",
            "Messages written to backup segments.",
            labels,
            registry=self.registry,
        )
        self._bytes = Counter(
            "blackbox_backup_segment_bytes",
            "Bytes of backup segments written.",
            labels,
            registry=self.registry,
        )
        self._lost = Counter(
            "blackbox_backup_lost_messages",
            "Messages the topic's retention removed before the backup read them.",
            labels,
            registry=self.registry,
        )
        self._store_up = Gauge(
            "blackbox_backup_store_up",
            "1 while the backup store answers, 0 during an outage (cuts are retried).",
            labels,
            registry=self.registry,
        )
        self._outage = Gauge(
            "blackbox_backup_store_outage_seconds",
            "How long the backup store has been unreachable (0 when it answers).",
            labels,
            registry=self.registry,
        )
        self._failed = Counter(
            "blackbox_backup_cut_failures",
            "Attempts to write a cut that failed and are retried (store, database, broker).",
            labels,
            registry=self.registry,
        )
        self._topic = topic

    def lag(self, partition: int, messages: int) -> None:
        self._lag.labels(topic=self._topic, partition=str(partition)).set(max(messages, 0))

    def cut_written(self, *, at: float, messages: int, size: int) -> None:
        self._cut_age.labels(topic=self._topic).set(at)
        self._events.labels(topic=self._topic).inc(messages)
        self._bytes.labels(topic=self._topic).inc(size)

    def lost(self, messages: int) -> None:
        self._lost.labels(topic=self._topic).inc(messages)

    def store_outage(self, *, up: bool, seconds: float) -> None:
        self._store_up.labels(topic=self._topic).set(1 if up else 0)
        self._outage.labels(topic=self._topic).set(seconds)

    def cut_failed(self) -> None:
        self._failed.labels(topic=self._topic).inc()
