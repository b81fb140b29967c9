"""Counting the distinct events of restored messages: copies counted once, conflicts named.

The topic holds each event at least once: a relay that restarts publishes again what
it had published but not yet deleted, byte for byte. Every reader keeps the first copy
of a (run, sequence) and drops the others, so a restore counts events, not messages:
an identical copy is a figure (re-delivered), while a copy of the same (run, sequence)
with another event id or other bytes is a conflict, which no re-delivery makes.

What is kept per event is small (the event id and an 8-byte digest of the message's
value, in one ``bytearray`` per run indexed by sequence), so a tally of millions of
events fits in tens of megabytes.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

from agent_blackbox.schemas import BlackboxError, Envelope, EnvelopeCodec

_ID = 16
_DIGEST = 8
_SLOT = _ID + _DIGEST
_EMPTY = bytes(_SLOT)
_SHOWN = 20


@dataclass(slots=True)
class EventTally:
    """The distinct events of the messages given to :meth:`add`, per run.

    Args:
        codec: decodes the envelopes (a value that does not decode is counted apart).
    """

    codec: EnvelopeCodec = field(default_factory=EnvelopeCodec)
    messages: int = 0
    duplicates: int = 0
    """Identical copies of an event already counted (re-deliveries)."""
    undecodable: int = 0
    conflicts: list[str] = field(default_factory=list)
    """The first conflicting copies, each naming run, sequence and what differs."""
    conflicting: int = 0
    agents: dict[str, str] = field(default_factory=dict)
    """Run → the agent that recorded it."""
    _slots: dict[str, bytearray] = field(default_factory=dict)
    _distinct: dict[str, int] = field(default_factory=dict)
    _copies: dict[str, int] = field(default_factory=dict)

    def add(self, value: bytes | None) -> None:
        """Count one message's envelope."""
        self.messages += 1
        try:
            envelope = self.codec.decode(value or b"")
        except BlackboxError:
            self.undecodable += 1
            return
        self._count(envelope, hashlib.blake2b(value or b"", digest_size=_DIGEST).digest())

    def distinct(self, run_id: str) -> int:
        """Distinct events of ``run_id``."""
        return self._distinct.get(run_id, 0)

    def copies(self, run_id: str) -> int:
        """Messages of ``run_id`` counted (distinct events, copies and conflicts)."""
        return self._copies.get(run_id, 0)

    @property
    def runs(self) -> list[str]:
        """Every run counted, in run id order."""
        return sorted(self._distinct)

    @property
    def events(self) -> int:
        """Distinct events of every run."""
        return sum(self._distinct.values())

    def _count(self, envelope: Envelope, digest: bytes) -> None:
        run_id, sequence = envelope.run_id, envelope.sequence
        self.agents.setdefault(run_id, envelope.agent_id)
        self._copies[run_id] = self._copies.get(run_id, 0) + 1
        if sequence < 1:
            self._conflict(f"run {run_id} sequence {sequence}: not a sequence (they start at 1)")
            return
        slots = self._slots.setdefault(run_id, bytearray())
        start = (sequence - 1) * _SLOT
        if len(slots) < start + _SLOT:
            slots.extend(bytes(start + _SLOT - len(slots)))
        slot = _slot(envelope.event_id, digest)
        held = bytes(slots[start : start + _SLOT])
        if held == _EMPTY:
            slots[start : start + _SLOT] = slot
            self._distinct[run_id] = self._distinct.get(run_id, 0) + 1
        elif held == slot:
            self.duplicates += 1
        else:
            self._conflict(_difference(run_id, sequence, held, slot))

    def _conflict(self, what: str) -> None:
        self.conflicting += 1
        if len(self.conflicts) < _SHOWN:
            self.conflicts.append(what)


def _slot(event_id: str, digest: bytes) -> bytes:
    try:
        raw = uuid.UUID(event_id).bytes
    except ValueError:  # not a UUID: its own digest stands for it
        raw = hashlib.blake2b(event_id.encode(), digest_size=_ID).digest()
    return raw + digest


def _difference(run_id: str, sequence: int, held: bytes, other: bytes) -> str:
    if held[:_ID] != other[:_ID]:
        first, second = uuid.UUID(bytes=held[:_ID]), uuid.UUID(bytes=other[:_ID])
        return (
            f"run {run_id} sequence {sequence}: a copy with other event id ({second}, the "
            f"first copy is {first}): two different events claim one sequence"
        )
    return (
        f"run {run_id} sequence {sequence}: a copy of event {uuid.UUID(bytes=held[:_ID])} "
        "with other bytes than the first: not a re-delivery"
    )
