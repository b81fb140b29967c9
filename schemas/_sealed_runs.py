"""Runs that have a data key accept no plaintext body.

A run recorded with encryption seals every body under its data key from its first sealed
event on. An event of such a run that carries a plaintext body was not written by the
run's recorder: someone appended it (a forged ``run.finished`` on a crashed run, a clear
body slipped into an encrypted run). Every reader refuses it: the view consumer records
an integrity violation, a timeline shows why instead of the body, replay stops with an
error naming the event.

``run.redacted`` is the one exception: retention appends it after the run's keys were
destroyed, so nothing is left to seal it with, and its body names only the keys and the
reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from agent_blackbox.schemas._compression import split_encoding
from agent_blackbox.schemas._envelope import Envelope
from agent_blackbox.schemas._errors import BlackboxError
from agent_blackbox.schemas._payload import PLAIN_ENCODING
from agent_blackbox.schemas.event_types import EventType

PLAINTEXT_IN_SEALED_RUN = "plaintext_in_sealed_run"
"""The integrity violation kind of a plaintext body in a run that has a data key."""

_REDACTED = EventType.RUN_REDACTED.value


class PlaintextInSealedRun(BlackboxError):
    """An event carries a plaintext body in a run whose bodies are sealed under a data
    key: it was not recorded by the run's writer, and its body is not shown or replayed."""

    def __init__(self, envelope: Envelope, *, key_id: str, sealed_at: int) -> None:
        self.run_id = envelope.run_id
        self.sequence = envelope.sequence
        self.event_id = envelope.event_id
        self.event_type = envelope.event_type
        self.key_id = key_id
        self.sealed_at = sealed_at
        super().__init__(
            f"run {envelope.run_id} sequence {envelope.sequence} ({envelope.event_type}, "
            f"event {envelope.event_id}) carries a plaintext body, but the run is sealed "
            f"under data key {key_id} since sequence {sealed_at}: the event was not written "
            "by the run's recorder (appended to the log by someone else); its body is "
            "refused. Check who can produce to the event topic, and see "
            "blackbox_views.integrity_violations"
        )


def is_plaintext(envelope: Envelope) -> bool:
    """Whether the body of ``envelope`` is stored in the clear (not sealed)."""
    return split_encoding(envelope.payload_encoding)[1] == PLAIN_ENCODING


def is_sealed(envelope: Envelope) -> bool:
    """Whether ``envelope`` shows its run has a data key: its body is sealed under one."""
    return envelope.key_id is not None and not is_plaintext(envelope)


class SealedRunGuard:
    """Follows the events of one run in sequence order and refuses a plaintext body
    once the run showed a data key.

    Args:
        key_id, sealed_at: the data key and sequence of a sealed event already seen (the
            view consumer knows them from the events index), if any.
    """

    __slots__ = ("key_id", "sealed_at")

    def __init__(self, *, key_id: str | None = None, sealed_at: int = 0) -> None:
        self.key_id = key_id
        self.sealed_at = sealed_at

    def refusal(self, envelope: Envelope) -> PlaintextInSealedRun | None:
        """Why the body of ``envelope`` must not be read, or None when it may be.

        A sealed event makes the run sealed from its sequence on; a plaintext event
        after it (other than ``run.redacted``) is refused.
        """
        if not is_plaintext(envelope):
            if self.key_id is None and envelope.key_id is not None:
                self.key_id, self.sealed_at = envelope.key_id, envelope.sequence
            return None
        if (
            self.key_id is None
            or envelope.sequence <= self.sealed_at
            or envelope.event_type == _REDACTED
        ):
            return None
        return PlaintextInSealedRun(envelope, key_id=self.key_id, sealed_at=self.sealed_at)


def refusing_plaintext(events: Iterable[Envelope]) -> Iterator[Envelope]:
    """``events`` (one run's, in sequence order) as they come, for a reader that opens
    their bodies.

    Raises:
        PlaintextInSealedRun: at the first plaintext body after the run showed a data key.
    """
    guard = SealedRunGuard()
    for envelope in events:
        refusal = guard.refusal(envelope)
        if refusal is not None:
            raise refusal
        yield envelope
