"""What the checkpoint signer decides, apart from where its state is kept.

The signer follows each run's hash chain as the topic delivers it (:func:`follow`) and
signs a head only when the write side's ``blackbox.runs`` holds the same head
(:func:`judge`): a producer that can write to the topic but not to the database can
neither get a made-up run signed nor extend a real one. Every refusal is a
:class:`SignerFinding`, which the signer records as an integrity violation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum, StrEnum

from agent_blackbox.outbox.storage import RunHead
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BlackboxError,
    Envelope,
    EventType,
    Settings,
    safe_text,
)
from agent_blackbox.schemas import (
    is_plaintext as body_in_clear,
)


class SignerFinding(StrEnum):
    """Why the signer refused a run (the ``kind`` of its integrity violation row)."""

    UNKNOWN_RUN = "unknown_run"
    """The topic holds a run that ``blackbox.runs`` does not: it was never recorded."""
    TENANT_MISMATCH = "tenant_mismatch"
    """The topic's events name another tenant than the database's run."""
    AHEAD_OF_DATABASE = "ahead_of_database"
    """The topic holds events past the database's last sequence: never committed."""
    HEAD_MISMATCH = "head_mismatch"
    """At the database's last sequence the topic has another chain hash."""
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    """Two events claim one run and sequence with another event id or chain hash."""
    PLAINTEXT_IN_SEALED_RUN = "plaintext_in_sealed_run"
    """A plaintext body follows an event sealed with a data key."""
    BROKEN_CHAIN = "broken_chain"
    """An event does not continue the chain followed so far (gap or wrong hash)."""


class Step(Enum):
    """What one delivered event did to a run's followed chain."""

    ADVANCED = "advanced"
    REPEAT = "repeat"
    """At or below the head: a redelivery, unless it conflicts (the caller checks)."""
    IGNORED = "ignored"
    """The run was refused before: nothing of it is followed any more."""
    BROKEN = "broken"
    PLAINTEXT = "plaintext"


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When a running run's head is signed before it ends: once it grew by
    ``every_events`` or stayed unsigned ``every_seconds`` (the database agreeing)."""

    every_events: int = 1000
    every_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.every_events < 1 or self.every_seconds <= 0:
            raise ValueError(
                "checkpoint policy needs every_events >= 1 and every_seconds > 0, not "
                f"{self.every_events!r} and {self.every_seconds!r}"
            )

    @classmethod
    def from_settings(cls, settings: Settings) -> CheckpointPolicy:
        """``BLACKBOX_CHECKPOINT_EVERY_EVENTS`` / ``_EVERY_SECONDS`` (or their defaults)."""
        return cls(settings.checkpoint_every_events, float(settings.checkpoint_every_seconds))

    @property
    def wait(self) -> timedelta:
        """How long a head may stay unsigned."""
        return timedelta(seconds=self.every_seconds)


@dataclass(slots=True)
class ChainHead:
    """The signer's position in one run's chain (a row of ``chain_heads``)."""

    run_id: str
    tenant_id: str | None = None
    last_sequence: int = 0
    chain_head: str = GENESIS_CHAIN_HASH
    broken_at: int | None = None
    """Where the signer stopped following: the run is never signed again."""
    finished: bool = False
    """A ``run.finished`` was followed."""
    sealed: bool = False
    """An event sealed with a data key was followed: plaintext may no longer follow."""
    signed_sequence: int = 0
    check_after: datetime | None = None
    """When an unsigned head is next due to be compared with the database."""

    @property
    def unsigned(self) -> bool:
        """Whether the followed head is past the last signed one and may still be signed."""
        return self.broken_at is None and self.last_sequence > self.signed_sequence


def follow(head: ChainHead, envelope: Envelope) -> Step:
    """Extend ``head`` by ``envelope`` when it is the next link of the chain. A repeat
    is reported as such even in a refused run, so a conflicting one is still flagged."""
    sequence = envelope.sequence
    if sequence <= head.last_sequence:
        return Step.REPEAT
    if head.broken_at is not None:
        return Step.IGNORED
    if (
        sequence != head.last_sequence + 1
        or not _chains(envelope, head.chain_head)
        or (head.tenant_id is not None and envelope.tenant_id != head.tenant_id)
    ):
        head.broken_at = sequence
        return Step.BROKEN
    if head.sealed and is_plaintext(envelope):
        head.broken_at = sequence
        return Step.PLAINTEXT
    head.last_sequence, head.chain_head = sequence, envelope.chain_hash
    head.tenant_id = envelope.tenant_id
    head.sealed = head.sealed or envelope.key_id is not None
    head.finished = head.finished or envelope.event_type == EventType.RUN_FINISHED
    return Step.ADVANCED


def _chains(envelope: Envelope, previous: str) -> bool:
    try:
        return envelope.chain_hash == envelope.expected_chain_hash(previous)
    except (BlackboxError, TypeError, ValueError, AttributeError):
        return False  # a field off its type cannot be hashed: it was tampered with


def is_plaintext(envelope: Envelope) -> bool:
    """Whether ``envelope`` carries a plaintext body that a sealed run may not hold.

    ``run.redacted`` is exempt: it is appended after the run's keys were destroyed,
    plain by design, and says only which keys went and why.
    """
    return (
        envelope.key_id is None
        and body_in_clear(envelope)
        and envelope.event_type != EventType.RUN_REDACTED
    )


def conflicts(existing_event_id: str | None, existing_chain: str, incoming: Envelope) -> bool:
    """Whether ``incoming`` claims the run and sequence of a known event but is another
    event (another chain hash, or another event id where the id is known)."""
    if incoming.chain_hash != existing_chain:
        return True
    return existing_event_id is not None and incoming.event_id != existing_event_id


@dataclass(frozen=True, slots=True)
class Verdict:
    """:func:`judge`'s answer: sign now, refuse (with the finding), or neither yet."""

    sign: bool = False
    finished: bool = False
    finding: SignerFinding | None = None
    detail: str = ""


WAIT = Verdict()


def judge(
    head: ChainHead,
    stored: RunHead | None,
    *,
    policy: CheckpointPolicy,
    now: datetime,
    sweep: bool = False,
) -> Verdict:
    """Compare the followed head with the database's and say what to do.

    A run the database does not know, of another tenant, or whose database head is
    behind or different from the followed one is refused. A database that knows more
    events than the topic delivered so far means wait. When both agree, the head is
    signed if the run ended, it grew by ``policy.every_events`` since the last
    signature, its wait ran out, or this is the periodic ``sweep`` of idle heads.
    """
    if head.broken_at is not None:
        return WAIT
    run = _show(head.run_id)
    if stored is None:
        return _refuse(SignerFinding.UNKNOWN_RUN, f"run {run} is not in blackbox.runs")
    if head.tenant_id is not None and stored.tenant_id != head.tenant_id:
        return _refuse(
            SignerFinding.TENANT_MISMATCH,
            f"run {run}: the topic says tenant {_show(head.tenant_id)}, "
            f"the database {_show(stored.tenant_id)}",
        )
    if head.last_sequence > stored.last_sequence:
        return _refuse(
            SignerFinding.AHEAD_OF_DATABASE,
            f"run {run}: the topic holds sequence {head.last_sequence}, the database "
            f"committed {stored.last_sequence} events",
        )
    if head.last_sequence < stored.last_sequence or not head.unsigned:
        return WAIT
    if head.chain_head != stored.chain_head:
        return _refuse(
            SignerFinding.HEAD_MISMATCH,
            f"run {run} sequence {head.last_sequence}: the topic's chain hash "
            f"{_show(head.chain_head)} is not the database's {_show(stored.chain_head)}",
        )
    ended = not stored.running
    due = (
        ended
        or sweep
        or head.last_sequence - head.signed_sequence >= policy.every_events
        or (head.check_after is not None and now >= head.check_after)
    )
    return Verdict(sign=True, finished=head.finished and ended) if due else WAIT


def _refuse(finding: SignerFinding, detail: str) -> Verdict:
    return Verdict(finding=finding, detail=detail)


def _show(value: object) -> str:
    return safe_text(value, limit=80)
