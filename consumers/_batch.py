"""The values a consumer hands to a projection and gets back from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from decimal import Decimal
from operator import attrgetter

from sqlalchemy import Connection

from agent_blackbox.schemas import Envelope


@dataclass(frozen=True, slots=True)
class Delivered:
    """An envelope as it came off Kafka: where it was read, and what it holds."""

    envelope: Envelope
    topic: str
    partition: int
    offset: int

    @property
    def key(self) -> tuple[str, int]:
        """``(run_id, sequence)``: the identity consumers deduplicate on."""
        return delivered_key(self)


delivered_key: Callable[[Delivered], tuple[str, int]] = attrgetter(
    "envelope.run_id", "envelope.sequence"
)
"""``Delivered.key`` as a function in the interpreter's compiled code, for a projection
that asks it of every record of a batch (``sorted(records, key=delivered_key)``)."""


def delivered(envelope: Envelope, topic: str, partition: int, offset: int) -> Delivered:
    """``Delivered(envelope, topic, partition, offset)`` at half the cost: the consumer
    makes one per message. The slots are set directly instead of through the frozen
    ``__init__``, which goes through ``object.__setattr__`` by name (it checks nothing
    more)."""
    made: Delivered = _new(Delivered)
    _set_envelope(made, envelope)
    _set_topic(made, topic)
    _set_partition(made, partition)
    _set_offset(made, offset)
    return made


_new = object.__new__
_SETTERS = {f.name: Delivered.__dict__[f.name].__set__ for f in fields(Delivered)}
_set_envelope = _SETTERS["envelope"]
_set_topic = _SETTERS["topic"]
_set_partition = _SETTERS["partition"]
_set_offset = _SETTERS["offset"]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one batch did: new events, ignored duplicates, integrity violations, poison,
    and stale copies (published by a relay after its lease had moved on) dropped unread.

    ``dead_lettered`` and ``stale`` are filled in by the consumer runtime, never by a
    projection.
    """

    inserted: int = 0
    duplicates: int = 0
    violations: int = 0
    dead_lettered: int = 0
    stale: int = 0
    passed_over: int = 0
    """Events of a kind this consumer has nothing to do with (the analytics consumer and
    a clock read, say): read, committed past, not stored."""

    @property
    def messages(self) -> int:
        """Every message the batch accounted for, whatever became of it."""
        kept = self.inserted + self.duplicates + self.violations
        return kept + self.dead_lettered + self.stale + self.passed_over

    def __add__(self, other: BatchOutcome) -> BatchOutcome:
        return BatchOutcome(
            inserted=self.inserted + other.inserted,
            duplicates=self.duplicates + other.duplicates,
            violations=self.violations + other.violations,
            dead_lettered=self.dead_lettered + other.dead_lettered,
            stale=self.stale + other.stale,
            passed_over=self.passed_over + other.passed_over,
        )


@dataclass(frozen=True, slots=True)
class CallCost:
    """What one newly projected LLM call cost, for the cost counter."""

    provider: str | None
    model: str | None
    cost_usd: Decimal | None
    unpriced: bool
    """Its cost is unknown although it did not fail (no price, or no usage)."""


@dataclass(frozen=True, slots=True)
class AnalyticsOutcome(BatchOutcome):
    """A batch of the analytics consumer: its outcome, and what its new calls cost
    (counted once the batch committed)."""

    costs: tuple[CallCost, ...] = ()


Projection = Callable[[Connection, Sequence[Delivered]], BatchOutcome]
"""Applies a batch through a caller-owned connection and never commits."""
