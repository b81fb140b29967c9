"""What the views forget when a run is shredded.

The events index keeps each event's input and output digests, readable by the reader
role. Once a run's data keys are destroyed, a digest is the last trace of the values
that were sealed, and a digest of a low-entropy value (a customer id, a small random
number) confirms a guess. When the views consumer takes a ``run.redacted`` note, the
digests the views hold of that run (events index and integrity violations) are
replaced by :data:`SHREDDED_DIGEST`, in the same transaction as the note's own row.
The chain hashes stay: they cover the encrypted payloads too and confirm nothing.

Anyone with produce access can write a correctly chained ``run.redacted`` to the topic,
so a note's effects (limited replay, scrubbed digests) apply only once the write side
confirms it (:class:`RedactionCheck`): the deletion ledger of this database records its
keys destroyed for its run, or, where the views live without the write side, the
retention job's signature on it verifies. Without either (no ledger here and no public
keys configured) notes are applied as they come, which is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection

from agent_blackbox.consumers._ledger import (
    DatabaseFacts,
    authenticity_problem,
    note_entry,
)
from agent_blackbox.consumers._tables import events_index, integrity_violations
from agent_blackbox.outbox.lifecycle import ledger_key_ids_txn, ledger_readable_txn
from agent_blackbox.schemas import (
    CheckpointVerifier,
    Envelope,
    EventType,
    PayloadPipeline,
    safe_text,
)

log = logging.getLogger(__name__)

SHREDDED_DIGEST = "shredded"
"""What a digest of a shredded run reads as in the views."""


def scrub_redacted_runs_txn(conn: Connection, envelopes: Iterable[Envelope]) -> int:
    """Replace the views' digests of every run a ``run.redacted`` among ``envelopes``
    names; the number of runs scrubbed. The caller commits."""
    run_ids = sorted({e.run_id for e in envelopes if e.event_type == EventType.RUN_REDACTED})
    if not run_ids:
        return 0
    events = events_index.c
    conn.execute(
        events_index.update()
        .where(events.run_id.in_(run_ids), events.input_digest != SHREDDED_DIGEST)
        .values(input_digest=SHREDDED_DIGEST, output_digest=SHREDDED_DIGEST)
    )
    violations = integrity_violations.c
    conn.execute(
        integrity_violations.update()
        .where(violations.run_id.in_(run_ids))
        .values(
            existing_input_digest=SHREDDED_DIGEST,
            existing_output_digest=SHREDDED_DIGEST,
            incoming_input_digest=SHREDDED_DIGEST,
            incoming_output_digest=SHREDDED_DIGEST,
        )
    )
    return len(run_ids)


class RedactionCheck:
    """Says which ``run.redacted`` notes the write side confirms (see the module).

    Args:
        verifier: the retention job's public keys; a signed note is confirmed when its
            signature verifies under one of them.
    """

    def __init__(self, verifier: CheckpointVerifier | None = None) -> None:
        self._verifier = verifier
        self._pipeline = PayloadPipeline()
        self._ledger_readable: bool | None = None
        self._warned = False

    def unconfirmed(self, conn: Connection, notes: Sequence[Envelope]) -> dict[str, str]:
        """The event ids of the ``run.redacted`` among ``notes`` that are not confirmed,
        each with the reason."""
        notes = [n for n in notes if n.event_type == EventType.RUN_REDACTED]
        if not notes:
            return {}
        if self._ledger_readable is None:
            self._ledger_readable = ledger_readable_txn(conn)
        if not self._ledger_readable and self._verifier is None:
            self._warn_unchecked()
            return {}
        problems = {n.event_id: self._problem(conn, n) for n in notes}
        return {event_id: why for event_id, why in problems.items() if why is not None}

    def _problem(self, conn: Connection, note: Envelope) -> str | None:
        entry = note_entry(note, self._pipeline)
        if entry.unreadable is not None:
            return f"its body cannot be read: {safe_text(entry.unreadable, limit=200)}"
        if not entry.key_ids:
            return "it names no data key"
        ledger = ledger_key_ids_txn(conn, note.run_id) if self._ledger_readable else frozenset()
        return authenticity_problem(entry, DatabaseFacts(ledger, {}, None), self._verifier)

    def _warn_unchecked(self) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning(
            "run.redacted notes are applied to the views unconfirmed: this database has "
            "no deletion ledger this consumer may read, and no public key of the retention "
            "job is configured (set BLACKBOX_SIGNING_PUBLIC_KEYS) to check their signatures"
        )
