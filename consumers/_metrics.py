"""Prometheus metrics of the consumers.

Metric families are created once per ``CollectorRegistry`` and shared by every
consumer using it (told apart by labels), so a process may create many consumers,
as the tests do, without duplicate-registration errors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from weakref import WeakKeyDictionary

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from agent_blackbox.consumers._batch import BatchOutcome, CallCost

_LABELS = ("consumer", "group", "topic")


@dataclass(frozen=True, slots=True)
class _Families:
    messages: Counter
    inserted: Counter
    duplicates: Counter
    violations: Counter
    dead_lettered: Counter
    stale: Counter
    passed_over: Counter
    failed_batches: Counter
    batch_seconds: Histogram
    lag: Gauge


_FAMILIES: WeakKeyDictionary[CollectorRegistry, _Families] = WeakKeyDictionary()
_LOCK = threading.Lock()


def _families(registry: CollectorRegistry) -> _Families:
    with _LOCK:
        families = _FAMILIES.get(registry)
        if families is None:
            families = _create(registry)
            _FAMILIES[registry] = families
        return families


def _create(registry: CollectorRegistry) -> _Families:
    def counter(name: str, doc: str) -> Counter:
        return Counter(f"blackbox_consumer_{name}", doc, _LABELS, registry=registry)

    return _Families(
        messages=counter("messages", "Kafka messages a consumer accounted for."),
        inserted=counter("events_inserted", "Events newly applied to the views."),
        duplicates=counter("duplicates", "Re-delivered events ignored as duplicates."),
        violations=counter("integrity_violations", "Events colliding with different digests."),
        dead_lettered=counter("dead_lettered", "Poison messages written to the DLQ topic."),
        stale=counter(
            "stale_dropped",
            "Stale relay copies (lease epoch older than one already read) dropped unapplied.",
        ),
        passed_over=counter(
            "passed_over", "Events of a kind the consumer has nothing to do with, not stored."
        ),
        failed_batches=counter("failed_batches", "Batches rolled back and rewound."),
        batch_seconds=Histogram(
            "blackbox_consumer_batch_seconds",
            "Time to apply and commit one batch.",
            _LABELS,
            registry=registry,
        ),
        lag=Gauge(
            "blackbox_consumer_lag_messages",
            "Messages of a partition not yet applied (the broker's high watermark as of the "
            "last fetch, minus the committed position).",
            (*_LABELS, "partition"),
            registry=registry,
        ),
    )


class ConsumerMetrics:
    """The metric children of one consumer (one label set)."""

    def __init__(
        self,
        *,
        consumer: str,
        group: str,
        topic: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        families = _families(REGISTRY if registry is None else registry)
        labels = {"consumer": consumer, "group": group, "topic": topic}
        self._messages = families.messages.labels(**labels)
        self._inserted = families.inserted.labels(**labels)
        self._duplicates = families.duplicates.labels(**labels)
        self._violations = families.violations.labels(**labels)
        self._dead_lettered = families.dead_lettered.labels(**labels)
        self._stale = families.stale.labels(**labels)
        self._passed_over = families.passed_over.labels(**labels)
        self._failed = families.failed_batches.labels(**labels)
        self._seconds = families.batch_seconds.labels(**labels)
        self._lag = families.lag
        self._labels = labels

    def batch_committed(self, outcome: BatchOutcome, seconds: float) -> None:
        """Count a committed batch."""
        self._messages.inc(outcome.messages)
        self._inserted.inc(outcome.inserted)
        self._duplicates.inc(outcome.duplicates)
        self._violations.inc(outcome.violations)
        self._dead_lettered.inc(outcome.dead_lettered)
        self._stale.inc(outcome.stale)
        self._passed_over.inc(outcome.passed_over)
        self._seconds.observe(seconds)

    def lag(self, partition: int, messages: int) -> None:
        """Set how far ``partition`` is behind."""
        self._lag.labels(**self._labels, partition=str(partition)).set(max(messages, 0))

    def violations_found(self, count: int) -> None:
        """Count integrity violations found outside a batch (the signer's sweep)."""
        self._violations.inc(count)

    def batch_failed(self) -> None:
        """Count a batch that was rolled back."""
        self._failed.inc()


@dataclass(frozen=True, slots=True)
class _CostFamilies:
    dollars: Counter
    unpriced: Counter


_COST_FAMILIES: WeakKeyDictionary[CollectorRegistry, _CostFamilies] = WeakKeyDictionary()


class CostCounter:
    """What the LLM calls the analytics consumer committed cost, by provider and model:
    ``blackbox_llm_cost_usd_total`` (dollars, exact per batch, a float as every
    Prometheus value is) and ``blackbox_llm_unpriced_calls_total`` (calls that did not
    fail whose cost is unknown). Counted once per call, after its batch committed."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        with _LOCK:
            families = _COST_FAMILIES.get(registry)
            if families is None:
                labels = ("provider", "model")
                families = _CostFamilies(
                    dollars=Counter(
                        "blackbox_llm_cost_usd",
                        "US dollars the LLM calls cost at the price table in force when the "
                        "analytics consumer read them (unpriced calls add nothing).",
                        labels,
                        registry=registry,
                    ),
                    unpriced=Counter(
                        "blackbox_llm_unpriced_calls",
                        "LLM calls that did not fail and have no known cost: no price for "
                        "the model (add one with BLACKBOX_PRICE_FILE) or no usage reported.",
                        labels,
                        registry=registry,
                    ),
                )
                _COST_FAMILIES[registry] = families
        self._families = families

    def count(self, costs: Iterable[CallCost]) -> None:
        """Add the committed calls ``costs`` (summed exactly per label set first)."""
        dollars: dict[tuple[str, str], Decimal] = {}
        unpriced: dict[tuple[str, str], int] = {}
        for call in costs:
            labels = (call.provider or "", call.model or "")
            if call.cost_usd is not None:
                dollars[labels] = dollars.get(labels, Decimal(0)) + call.cost_usd
            elif call.unpriced:
                unpriced[labels] = unpriced.get(labels, 0) + 1
        for (provider, model), amount in dollars.items():
            self._families.dollars.labels(provider=provider, model=model).inc(float(amount))
        for (provider, model), calls in unpriced.items():
            self._families.unpriced.labels(provider=provider, model=model).inc(calls)
