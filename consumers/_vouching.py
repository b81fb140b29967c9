"""Which events of a batch the write side vouches for.

Anyone who may produce to the event topic can write an envelope there: a run that was
never recorded, an event past the end of a real run, an event after a real run's
``run.finished``. The signer and ``blackbox verify`` catch them; the views must not
show them as if they were recorded, nor count them. An event is *unverified* (the
reason is kept with it) when

- the write side's runs table holds no such run (or holds it under another tenant);
- its sequence is past the head the write side holds for its run, or it is at the head
  and its chain hash is not the write side's chain head;
- its chain hash does not follow from its predecessor's (the one in the same batch, or
  the one the events index holds; sequence 1 follows the genesis hash), where that
  predecessor is not unverified itself (its chain hash then proves nothing);
- it comes after the run's ``run.finished`` (only a ``run.redacted`` may, and that one
  is judged by :class:`~agent_blackbox.consumers._redacted_views.RedactionCheck`).

The write side is asked through :mod:`agent_blackbox.outbox.lifecycle` (one statement
per batch, by primary key), in the database the views live in: the usual deployment
keeps both in one Postgres. Views kept in another database see the write side's
``blackbox.runs`` only if the operator maps it there (a foreign table through
``postgres_fdw``, see docs/security.md); without it, the write side's checks are
skipped (logged once) and the chain and ``run.finished`` checks still apply.

Hashing the chain is most of the work (about 10 µs an event); an event at the write
side's head is compared with its chain head instead.

The verdict is made when the event is consumed, against the write side as it is then:
a genuine event is committed before the relay publishes it, so it is never past the
head. A predecessor that is neither in the batch nor indexed (a rebuild whose first
events the topic no longer holds) leaves the chain unjudged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text

from agent_blackbox.consumers._tables import VIEWS_SCHEMA
from agent_blackbox.outbox.lifecycle import RunHead, run_heads_txn, runs_readable_txn
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, Envelope, EventType

log = logging.getLogger(__name__)

EventKey = tuple[str, int]
"""``(run_id, sequence)``."""


@dataclass(frozen=True, slots=True)
class Unverified:
    """Why the write side does not vouch for one event."""

    reason: str
    unknown_run: bool = False
    """The write side holds no such run: every event of it is unverified."""


# For each (run, sequence before a batch's event) the stored predecessor's chain hash;
# and each run's finished sequence. Primary key probes only, whatever the runs' length.
_STORED = text(
    f"""
    SELECT w.run_id, w.before, p.chain_hash, r.finished_sequence
      FROM unnest(CAST(:run_ids AS text[]), CAST(:befores AS bigint[])) AS w(run_id, before)
      LEFT JOIN {VIEWS_SCHEMA}.events p
             ON p.run_id = w.run_id AND p.sequence = w.before AND p.unverified IS NULL
      LEFT JOIN {VIEWS_SCHEMA}.runs r ON r.run_id = w.run_id
    """
)


@dataclass(frozen=True, slots=True)
class _Stored:
    """What the views already hold that a batch's events are judged against."""

    chain: Mapping[EventKey, str]
    finished: Mapping[str, int]


Follows = Callable[[Envelope, str], bool]
"""Whether an envelope's chain hash follows from the given previous chain hash."""


def follows(envelope: Envelope, previous: str) -> bool:
    """Whether ``envelope``'s chain hash follows from ``previous`` (one that is no hex
    digest is followed by nothing)."""
    try:
        return envelope.chain_hash == envelope.expected_chain_hash(previous)
    except ValueError:
        return False


class Vouching:
    """Judges the events of each batch (see the module); one per consumer."""

    def __init__(self) -> None:
        self._write_side: bool | None = None
        self._follows: Follows = follows

    def unverified(
        self, conn: Connection, envelopes: Sequence[Envelope]
    ) -> dict[EventKey, Unverified]:
        """The events among ``envelopes`` (one per ``(run_id, sequence)``) that the
        write side does not vouch for, each with the reason; usually none."""
        if not envelopes:
            return {}
        runs: dict[str, list[Envelope]] = {}
        for envelope in envelopes:
            runs.setdefault(envelope.run_id, []).append(envelope)
        heads = run_heads_txn(conn, sorted(runs)) if self._readable(conn) else None
        stored = _stored(conn, runs)
        found: dict[EventKey, Unverified] = {}
        for run_id, events in runs.items():
            events.sort(key=lambda e: e.sequence)
            head = heads.get(run_id) if heads is not None else None
            _judge_run(events, heads is not None, head, stored, found, self._follows)
        if found:
            _warn(found)
        return found

    def _readable(self, conn: Connection) -> bool:
        if self._write_side is None:
            self._write_side = runs_readable_txn(conn)
            if not self._write_side:
                log.warning(
                    "the write side's runs table is not readable from the view database: "
                    "events of runs it never recorded and events past a run's head are not "
                    "marked unverified (map blackbox.runs into this database to check them)"
                )
        return self._write_side


def _judge_run(
    events: Sequence[Envelope],
    asked: bool,
    head: RunHead | None,
    stored: _Stored,
    found: dict[EventKey, Unverified],
    follows: Follows = follows,
) -> None:
    """Add the unverified events of one run's ``events`` (in sequence order) to
    ``found``; ``asked``: whether the write side was asked (``head`` is its answer).

    One pass with the common case (nothing wrong) first: this runs for every event a
    consumer takes, and the chain's hash is most of its time."""
    if asked and head is None:
        unknown = Unverified("the write side holds no run of this id", unknown_run=True)
        found.update(((e.run_id, e.sequence), unknown) for e in events)
        return
    run_id = events[0].run_id
    chains = {e.sequence: e.chain_hash for e in events}  # less the unverified, below
    before = stored.chain.get
    finished = stored.finished.get(run_id)
    last, tenant = (head.last_sequence, head.tenant_id) if head is not None else (None, None)
    for envelope in events:
        sequence = envelope.sequence
        if finished is not None and sequence > finished:
            why = _after(envelope, finished)
        elif last is not None and (sequence >= last or envelope.tenant_id != tenant):
            why = _head_problem(envelope, head)
        else:
            why = None
        if why is None:
            previous = (
                GENESIS_CHAIN_HASH
                if sequence == 1
                else chains.get(sequence - 1) or before((run_id, sequence - 1))
            )
            if previous is not None and not (
                sequence == last or follows(envelope, previous)  # at the head: compared
            ):
                why = f"its chain hash does not follow from sequence {sequence - 1}'s"
        if why is not None:
            found[(run_id, sequence)] = Unverified(why)
            del chains[sequence]  # an unverified event vouches for no successor
        elif finished is None and envelope.event_type == EventType.RUN_FINISHED:
            finished = sequence


def _after(envelope: Envelope, finished: int) -> str | None:
    """Why ``envelope``, after a run's end at ``finished``, is unverified: only a
    ``run.redacted`` may come there."""
    if envelope.event_type == EventType.RUN_REDACTED:
        return None
    return f"it follows the run's run.finished (sequence {finished})"


def _head_problem(envelope: Envelope, head: RunHead | None) -> str | None:
    if head is None:
        return None
    if head.tenant_id != envelope.tenant_id:
        return "the write side holds this run under another tenant"
    if envelope.sequence > head.last_sequence:
        return f"sequence {envelope.sequence} is past the write side's head ({head.last_sequence})"
    if envelope.sequence == head.last_sequence and envelope.chain_hash != head.chain_head:
        return "its chain hash is not the write side's chain head"
    return None


def _stored(conn: Connection, runs: Mapping[str, Sequence[Envelope]]) -> _Stored:
    """The stored predecessors of the events whose predecessor is not in the batch,
    and each run's finished sequence, in one statement."""
    run_ids: list[str] = []
    befores: list[int] = []
    for run_id, events in runs.items():
        present = {e.sequence for e in events}
        wanted = sorted({e.sequence - 1 for e in events} - present) or [0]
        for before in wanted:
            run_ids.append(run_id)
            befores.append(before)
    chain: dict[EventKey, str] = {}
    finished: dict[str, int] = {}
    rows = conn.execute(_STORED, {"run_ids": run_ids, "befores": befores})
    for run_id, before, chain_hash, finished_sequence in rows:
        if chain_hash is not None:
            chain[(run_id, int(before))] = str(chain_hash)
        if finished_sequence is not None:
            finished[run_id] = int(finished_sequence)
    return _Stored(chain, finished)


def _warn(found: Mapping[EventKey, Unverified]) -> None:
    (run_id, sequence), first = min(found.items())
    log.warning(
        "%d event(s) of %d run(s) the write side does not vouch for are marked unverified "
        "(kept out of totals and exports); the first: run %r sequence %d: %s",
        len(found),
        len({r for r, _ in found}),
        run_id,
        sequence,
        first.reason,
    )
