"""What the views forget when a run is shredded.

The events index keeps each event's input and output digests, readable by the reader
role. Once a run's data keys are destroyed, a digest is the last trace of the values
that were sealed, and a digest of a low-entropy value (a customer id, a small random
number) confirms a guess. When the views consumer takes a ``run.redacted`` note, the
digests the views hold of that run (events index and integrity violations) are
replaced by :data:`SHREDDED_DIGEST`, in the same transaction as the note's own row.
The chain hashes stay: they cover the encrypted payloads too and confirm nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection

from agent_blackbox.consumers._tables import events_index, integrity_violations
from agent_blackbox.schemas import Envelope, EventType

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
