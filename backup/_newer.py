"""Destructions newer than a cut, from wherever they can still be read.

A restore brings back the key rows of its cut; a subject forgotten after the cut must
stay forgotten. Three places may know of such a destruction, and a disaster may have
taken any of them, so each is read if it can be and said otherwise:

- later cuts in the same store (their snapshot's ledger and the ``run.redacted`` notes
  in their segments), when their manifests are genuine and chained;
- the production database's deletion ledger;
- the production topic past the cut's positions (``run.redacted`` notes).

Ledger rows are applied as they are (the database's own record); notes go through the
same authentication as ``blackbox ledger reapply``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

import agent_blackbox.outbox.snapshot as write_side
from agent_blackbox.backup._chain import load_chain
from agent_blackbox.backup._manifest import Manifest
from agent_blackbox.backup._pruned import load_pruned
from agent_blackbox.backup._restore import table_rows
from agent_blackbox.backup._segment import decode_segment
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._verify import fetch_checked
from agent_blackbox.broker import read_ranges, watermarks
from agent_blackbox.consumers import LedgerEntry, entries_of
from agent_blackbox.schemas import (
    BlackboxError,
    CheckpointVerifier,
    Envelope,
    EnvelopeCodec,
    EventType,
    PayloadPipeline,
    Settings,
)
from agent_blackbox.wiring import COMMAND_POOL


@dataclass(slots=True)
class NewerDeletions:
    """Ledger rows and notes newer than a cut, and where they were (not) read."""

    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, LedgerEntry] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)

    def add_rows(self, rows: Iterable[dict[str, Any]], known: int) -> None:
        for row in rows:
            if int(row["id"]) > known:
                self.rows.setdefault(int(row["id"]), row)

    def add_notes(self, envelopes: Iterable[Envelope]) -> None:
        for entry in entries_of(envelopes, PayloadPipeline()):
            if entry.envelope is not None:
                self.notes.setdefault(entry.envelope.event_id, entry)


def newer_deletions(
    production: Settings,
    store: BackupStore,
    cut: Manifest,
    verifier: CheckpointVerifier,
) -> NewerDeletions:
    """Every destruction after ``cut`` that can still be read (see the module)."""
    found = NewerDeletions()
    known = max((int(r["id"]) for r in table_rows(store, cut, "deletion_ledger")), default=0)
    _later_cuts(found, store, cut, verifier, known)
    _production_database(found, production, known)
    _production_topic(found, production, cut)
    return found


def _later_cuts(
    found: NewerDeletions,
    store: BackupStore,
    cut: Manifest,
    verifier: CheckpointVerifier,
    known: int,
) -> None:
    chain = load_chain(store, verifier)
    doubtful = {p.where for p in chain.problems}
    later: list[Manifest] = []
    for manifest in chain.manifests:
        if manifest.key in doubtful:
            break  # nothing past a manifest that is not genuine is trusted
        if manifest.number > cut.number:
            later.append(manifest)
    if not later:
        return
    # A later cut's damaged object is said and passed over: the cut being restored is
    # whole, and what the other later cuts, the database and the topic hold still counts.
    for manifest in reversed(later):  # the newest ledger that reads holds the others'
        try:
            found.add_rows(table_rows(store, manifest, "deletion_ledger"), known)
            break
        except BlackboxError as exc:
            found.unread.append(f"deletion ledger of later cut {manifest.number} ({exc})")
    gone = load_pruned(store, verifier).segments
    codec = EnvelopeCodec()
    for manifest in later:
        for segment in manifest.segments:
            if segment.key in gone:
                continue
            try:
                data = fetch_checked(store, segment.key, segment.sha256)
                values = [m.value or b"" for m in decode_segment(data, key=segment.key)]
            except BlackboxError as exc:
                found.unread.append(f"run.redacted notes of later cut {manifest.number} ({exc})")
                continue
            found.add_notes(
                e for e in _decodable(codec, values) if e.event_type == EventType.RUN_REDACTED
            )
    found.read.append(f"{len(later)} later backup cuts")


def _production_database(found: NewerDeletions, production: Settings, known: int) -> None:
    try:
        engine = COMMAND_POOL.engine(production.database_url)
        try:
            with engine.connect() as conn:
                found.add_rows(write_side.ledger_rows_txn(conn), known)
        finally:
            engine.dispose()
    except SQLAlchemyError as exc:
        found.unread.append(f"production database ({str(exc).splitlines()[0]})")
        return
    found.read.append("production database")


def _production_topic(found: NewerDeletions, production: Settings, cut: Manifest) -> None:
    codec = EnvelopeCodec()
    try:
        ends = watermarks(production, production.topic, timeout_s=10)
        ranges = {p: (cut.positions.get(p, 0), high) for p, (_low, high) in ends.items()}
        messages = read_ranges(production, production.topic, ranges)
        found.add_notes(_decodable(codec, (m.value() or b"" for m in messages)))
    except BlackboxError as exc:
        found.unread.append(f"production topic ({exc})")
        return
    found.read.append("production topic")


def _decodable(codec: EnvelopeCodec, values: Iterable[bytes]) -> Iterator[Envelope]:
    for value in values:
        try:
            yield codec.decode(value)
        except BlackboxError:
            continue
