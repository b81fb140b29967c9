"""What a writer needs to know of runs and side effects that a crashed agent left open."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agent_blackbox.outbox._writer import Cursor, RunIdentity


@dataclass(frozen=True, slots=True)
class PendingEffect:
    """A side effect whose intent committed but whose receipt is missing or unknown.

    ``status`` is ``pending`` when the agent died between intent and receipt, and
    ``unknown`` when the call raised without saying whether it happened.
    """

    run_id: str
    idempotency_key: str
    effect: str
    intent_sequence: int
    status: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a writer needs to carry on recording a run it did not start."""

    identity: RunIdentity
    cursor: Cursor
    status: str
    state: str | None
