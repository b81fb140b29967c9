"""What ``blackbox verify`` reports: the problems it finds, what became of the checkpoint,
what the write side's database said of the run, and the report of one run."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the history scan loads Kafka's client; a report does not need it
    from agent_blackbox.replayer._history import SkippedMessage


class Problem(StrEnum):
    """What is wrong with a stored run; :attr:`VerifyReport.sequence` says where."""

    NO_EVENTS = "no_events"
    """The stream held no event at all."""
    WRONG_RUN = "wrong_run"
    """An envelope of another run is in the stream."""
    SEQUENCE_GAP = "sequence_gap"
    """An event is missing, repeated or out of order (or its sequence was changed)."""
    BROKEN_CHAIN = "broken_chain"
    """An event's chain hash is not the one the chain computes: the event, its inline
    payload or its chain hash was changed after it was written."""
    MISSING_PAYLOAD = "missing_payload"
    """An event has neither an inline payload nor a ``payload_ref``."""
    PAYLOAD_MISMATCH = "payload_mismatch"
    """A body stored out of line is missing, unreadable, or does not hash to its ref."""
    UNFINISHED = "unfinished"
    """No ``run.finished`` event; a failure only with ``require_finished``."""
    CHECKPOINT_MISSING = "checkpoint_missing"
    """No checkpoint was given though one was required."""
    CHECKPOINT_MISMATCH = "checkpoint_mismatch"
    """A genuine checkpoint signed another run, tenant, length or head than the log's."""
    FORGED_CHECKPOINT = "forged_checkpoint"
    """The checkpoint's signature does not verify under any known signer key."""
    TRUNCATED = "truncated"
    """The database or the events index knows of more events than the log holds: events
    were removed, or never published, before they could be verified."""
    NOT_IN_DATABASE = "not_in_database"
    """The database does not know the run (and no final checkpoint vouches for it)."""
    AHEAD_OF_DATABASE = "ahead_of_database"
    """The log holds events past the database's last sequence: never committed."""
    HEAD_MISMATCH = "head_mismatch"
    """At the database's last sequence the log carries another chain hash."""
    PLAINTEXT_IN_SEALED_RUN = "plaintext_in_sealed_run"
    """A plaintext body follows an event sealed with a data key."""
    UNREADABLE = "unreadable"
    """The run's index entry or its log could not be read (the detail says why)."""


class CheckpointStatus(StrEnum):
    """What became of the checkpoint; a ``str``, so it compares equal to its value."""

    VALID = "valid"
    """Genuine, and it signed exactly this log's run, tenant, last sequence and head."""
    MISSING = "missing"
    """No checkpoint was given."""
    FORGED = "forged"
    """Its signature does not verify."""
    MISMATCH = "mismatch"
    """Genuine, but what it signed is not this log."""
    NOT_CHECKED = "not checked"
    """Genuine, but the log went wrong before the signed head could be compared."""


@dataclass(frozen=True, slots=True)
class RecordedHead:
    """A run as the write side's database holds it (``blackbox.runs``)."""

    last_sequence: int
    chain_head: str
    ended: bool
    """The run is no longer ``running``."""


@dataclass(frozen=True, slots=True)
class DatabaseCheck:
    """What the database said of a run just before and just after its log was read.

    Read before: every event it counts was committed, and (with ``pending_before`` 0)
    published, before the log was read, so the log must hold it. Read after: the log
    can hold no event it does not count. ``None``: the database has no such run.
    """

    before: RecordedHead | None
    after: RecordedHead | None
    pending_before: int | None = None
    """The run's events still in the outbox (not yet published) before the log was
    read; None when that could not be read."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The result of verifying one run. ``detail`` names sequences, digests and ids,
    never payload content, and is already safe to print (see
    :func:`agent_blackbox.schemas.safe_text`)."""

    run_id: str
    events: int
    """Envelopes read; the walk stops at the first problem in the log."""
    problem: Problem | None = None
    """The first problem found, or None when the run verified."""
    sequence: int | None = None
    """The first sequence at which the log is not sound: the bad event's, or the
    missing one's. None for problems of the run as a whole."""
    detail: str = ""
    checkpoint: CheckpointStatus = CheckpointStatus.MISSING
    finished: bool = False
    """Whether the sound part of the log holds a ``run.finished`` event."""
    last_sequence: int = 0
    """The last event verified sound (0 when none was)."""
    chain_head: str | None = None
    """The chain hash of event :attr:`last_sequence`: what a signer signs."""
    unchecked_blobs: int = 0
    """Events whose out-of-line body was not checked: no blob reader was given, or it
    may not read the body (the login's role or grants)."""
    unverified_from: int | None = None
    """The first sequence no genuine checkpoint covers, when the log is sound but not
    vouched for to its end (no checkpoint, or a mid-run one); None otherwise."""
    skipped_messages: tuple[SkippedMessage, ...] = ()
    """Messages under the run's key that are not its events, passed over: a finding of
    the topic's, though the run's own log may be sound."""

    @property
    def sound(self) -> bool:
        """Whether no problem was found (the log may still be unverified)."""
        return self.problem is None

    @property
    def ok(self) -> bool:
        """Whether the run verified: no problem, and a genuine checkpoint covers it."""
        return self.problem is None and self.unverified_from is None

    @property
    def result(self) -> str:
        """``ok``, ``unverified`` (sound but not covered by a checkpoint), or the problem."""
        if self.problem is not None:
            return str(self.problem)
        return "unverified" if self.unverified_from is not None else "ok"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "result": self.result,
            "unverified_from": self.unverified_from,
            "events": self.events,
            "problem": None if self.problem is None else str(self.problem),
            "sequence": self.sequence,
            "detail": self.detail,
            "checkpoint": str(self.checkpoint),
            "finished": self.finished,
            "last_sequence": self.last_sequence,
            "chain_head": self.chain_head,
            "unchecked_blobs": self.unchecked_blobs,
            "skipped_messages": [m.to_dict() for m in self.skipped_messages],
        }
