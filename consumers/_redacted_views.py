"""What the views forget when a run is shredded.

The events index keeps each event's input and output digests, readable by the reader
role. Once a run's data keys are destroyed, a digest is the last trace of the values
that were sealed, and a digest of a low-entropy value (a customer id, a small random
number) confirms a guess. When the views consumer takes a ``run.redacted`` note, the
digests the views hold of that run (events index and integrity violations) are
replaced by :data:`SHREDDED_DIGEST`, its events' attributes cut to those that hold
no value of the subject (:data:`KEPT_ATTRIBUTES`), its session and user ids cleared and
its words dropped from the full-text index, in the same transaction as the note's own
row.
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

from sqlalchemy import Connection, select, text, union

from agent_blackbox.consumers._ledger import (
    DatabaseFacts,
    authenticity_problem,
    note_entry,
)
from agent_blackbox.consumers._replay_results import forget_replay_values_txn
from agent_blackbox.consumers._tables import (
    events_index,
    integrity_violations,
    message_text,
    run_rollups,
    runs_view,
)
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

KEPT_ATTRIBUTES = (
    *("provider", "model", "latency_ms", "finish_reason", "prompt_tokens"),
    *("completion_tokens", "cached_tokens", "total_tokens", "body_truncated", "error"),
    *("tool", "effect", "status", "branch", "parent_branch", "started", "code_version"),
    *("parent_run_id", "streamed", "tool_calls_requested", "tool_calls_invalid", "clock"),
    *("kind", "redaction", "prompt_templates", "cache_write_tokens"),
)
"""The attributes the events index keeps of a shredded run's events: names, counts,
times and classes the recorder writes itself. Every other attribute (a state's name,
an idempotency key, an external id, a tag) may hold a value of the subject and goes."""


_KEPT = text(
    "(SELECT coalesce(jsonb_object_agg(a.key, a.value), '{}'::jsonb) "
    "FROM jsonb_each(blackbox_views.events.attributes) AS a WHERE a.key = ANY(:kept))"
)


def scrub_redacted_runs_txn(conn: Connection, envelopes: Iterable[Envelope]) -> int:
    """Replace the views' digests of every run a ``run.redacted`` among ``envelopes``
    names, and keep only :data:`KEPT_ATTRIBUTES` of its events' attributes; the number
    of runs scrubbed. The caller commits."""
    run_ids = sorted({e.run_id for e in envelopes if e.event_type == EventType.RUN_REDACTED})
    scrub_run_views_txn(conn, run_ids)
    return len(run_ids)


def scrub_run_views_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """Forget in the views what ``run_ids``' destroyed keys protected: their events'
    digests become :data:`SHREDDED_DIGEST` (in the events index and the integrity
    violations), their attributes keep only :data:`KEPT_ATTRIBUTES`, their session and
    user ids and their words go. What a confirmed ``run.redacted`` does, and what a
    restore does to the runs its ledger names. The caller commits."""
    if not run_ids:
        return
    run_ids = list(run_ids)
    events = events_index.c
    conn.execute(
        events_index.update()
        .where(
            events.run_id.in_(run_ids),
            # IS DISTINCT FROM: an event without an input digest is scrubbed all the same.
            events.input_digest.is_distinct_from(SHREDDED_DIGEST)
            | events.output_digest.is_distinct_from(SHREDDED_DIGEST),
        )
        .values(
            input_digest=SHREDDED_DIGEST,
            output_digest=SHREDDED_DIGEST,
            attributes=_KEPT.bindparams(kept=list(KEPT_ATTRIBUTES)),
        )
    )
    forget_run_labels_txn(conn, run_ids)
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


def unscrubbed_view_runs_txn(conn: Connection, run_ids: Sequence[str]) -> list[str]:
    """The runs of ``run_ids`` the views still hold a digest, session or user id of
    (what :func:`scrub_run_views_txn` would replace)."""
    if not run_ids:
        return []
    ids = list(run_ids)
    events, runs = events_index.c, runs_view.c
    digested = (
        select(events.run_id)
        .where(events.run_id.in_(ids))
        .where(
            events.input_digest.is_distinct_from(SHREDDED_DIGEST)
            | events.output_digest.is_distinct_from(SHREDDED_DIGEST)
        )
    )
    labelled = (
        select(runs.run_id)
        .where(runs.run_id.in_(ids))
        .where(runs.session_id.is_not(None) | runs.user_id.is_not(None))
    )
    found = conn.execute(union(digested, labelled)).scalars()
    return sorted(str(r) for r in found)


def forget_run_labels_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """Forget what the views hold of ``run_ids`` that names a person or what they said:
    the runs' session and user ids, and the words of their messages in the full-text
    index. The caller commits."""
    if not run_ids:
        return
    ids = list(run_ids)
    forget_replay_values_txn(conn, ids)
    conn.execute(
        runs_view.update()
        .where(runs_view.c.run_id.in_(ids))
        .where((runs_view.c.session_id.is_not(None)) | (runs_view.c.user_id.is_not(None)))
        .values(session_id=None, user_id=None)
    )
    forget_words_txn(conn, ids)


def forget_words_txn(conn: Connection, run_ids: Sequence[str]) -> None:
    """Drop the words of ``run_ids`` from the full-text index (their calls' rows and
    their rollups' words). The caller commits."""
    if not run_ids:
        return
    ids = list(run_ids)
    conn.execute(message_text.delete().where(message_text.c.run_id.in_(ids)))
    conn.execute(
        run_rollups.update()
        .where(run_rollups.c.run_id.in_(ids), run_rollups.c.words.is_not(None))
        .values(words=None)
    )


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
