"""The values a consumer hands to a projection and gets back from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
        return (self.envelope.run_id, self.envelope.sequence)


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

    @property
    def messages(self) -> int:
        """Every message the batch accounted for, whatever became of it."""
        return self.inserted + self.duplicates + self.violations + self.dead_lettered + self.stale

    def __add__(self, other: BatchOutcome) -> BatchOutcome:
        return BatchOutcome(
            inserted=self.inserted + other.inserted,
            duplicates=self.duplicates + other.duplicates,
            violations=self.violations + other.violations,
            dead_lettered=self.dead_lettered + other.dead_lettered,
            stale=self.stale + other.stale,
        )


Projection = Callable[[Connection, Sequence[Delivered]], BatchOutcome]
"""Applies a batch through a caller-owned connection and never commits."""
