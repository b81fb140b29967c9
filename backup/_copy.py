"""Bringing a checked cut (or a selection of its runs) back into a target, in order:
the deletion ledger with the rows, the events, the views, the blobs. Every run the
ledger names comes back as ``forget`` left it: keys destroyed, rows and views scrubbed.

Shared by the drill (everything, then verified and dropped) and by ``blackbox restore``
(a selection, kept for an investigation).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import Engine

from agent_blackbox.backup._errors import BackupError
from agent_blackbox.backup._newer import NewerDeletions, newer_deletions
from agent_blackbox.backup._restore import (
    EVERYTHING,
    RestoredTables,
    Selection,
    produce_events,
    restore_blobs,
    restore_tables,
)
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._tally import EventTally
from agent_blackbox.backup._target import Target
from agent_blackbox.backup._verify import StoreCheck
from agent_blackbox.consumers import (
    LedgerReport,
    ViewConsumer,
    entries_of,
    event_references_txn,
    reapply_ledger,
    scrub_run_views_txn,
)
from agent_blackbox.outbox.lifecycle import shredded_runs_txn
from agent_blackbox.schemas import CheckpointVerifier, PayloadPipeline, Settings

Say = Callable[[str], None]


class Stages:
    """Times each stage (into ``times``) and says when it starts."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.say(name)
        began = time.monotonic()
        try:
            yield
        finally:
            self.times[name] = time.monotonic() - began


@dataclass(slots=True)
class RestoredCopy:
    """What was brought back into a target."""

    tables: RestoredTables
    newer: NewerDeletions
    ledger: LedgerReport
    produced: dict[int, int] = field(default_factory=dict)
    """Messages produced to the target topic, per partition (re-delivered copies
    included: the copy's topic holds what the backed-up topic held)."""
    tally: EventTally = field(default_factory=EventTally)
    """The distinct events of those messages, the re-delivered copies and conflicts."""
    blobs: int = 0
    scrubbed: list[str] = field(default_factory=list)
    """Runs the restored ledger names as shredded, scrubbed in the rebuilt views."""

    @property
    def messages(self) -> int:
        """Messages produced to the target topic."""
        return sum(self.produced.values())

    @property
    def events(self) -> int:
        """Distinct events restored (each re-delivered copy counted once)."""
        return self.tally.events


def restore_copy(
    production: Settings,
    store: BackupStore,
    check: StoreCheck,
    target: Target,
    engine: Engine,
    *,
    verifier: CheckpointVerifier,
    stage: Stages,
    selection: Selection = EVERYTHING,
) -> RestoredCopy:
    """Restore ``check``'s cut (the runs ``selection`` admits) into ``target``.

    Raises:
        BackupCorrupt, BackupError, KafkaUnavailable: an object, the target or the broker
            failed; the target holds a partial copy (drop it).
    """
    cut = check.cut
    if cut is None:
        raise BackupError("nothing to restore: the backup has no cut")
    with stage("apply the ledger, restore rows"):
        newer = newer_deletions(production, store, cut, verifier)
        for gone in newer.unread:
            stage.say(f"newer deletions not read from the {gone}")
        tables = restore_tables(
            store,
            cut,
            engine,
            heads=check.heads,
            newer_ledger=newer.rows.values(),
            selection=selection,
        )
        notes = [*entries_of(check.notes, PayloadPipeline()), *newer.notes.values()]
        wanted = [n for n in notes if selection.admits(n.run_id)]
        ledger = reapply_ledger(engine, wanted, verifier=verifier)
    copy = RestoredCopy(tables, newer, ledger)
    with stage("restore events"):
        copy.produced = produce_events(
            store, check.segments_held(), target.settings, selection=selection, tally=copy.tally
        )
    with stage("rebuild the views"):
        build_views(target.settings, engine, expected=copy.messages)
        copy.scrubbed = scrub_views(engine)
    with stage("restore blobs"):
        only = None
        if selection.run_ids is not None:
            with engine.connect() as conn:
                only = frozenset(event_references_txn(conn)[1])
        copy.blobs = restore_blobs(store, cut, engine, only=only)
    return copy


def scrub_views(engine: Engine) -> list[str]:
    """Apply ``forget``'s scrub of the views to every run the target's deletion ledger
    names; those runs.

    The rebuilt views hold what the restored events say: a run forgotten after the cut
    has no ``run.redacted`` among them (nor has one recorded unencrypted), so its
    digests, attributes and labels would stay. This runs before the copy is handed over
    (no one else holds its credentials yet).
    """
    with engine.begin() as conn:
        run_ids = shredded_runs_txn(conn)
        scrub_run_views_txn(conn, run_ids)
    return run_ids


def build_views(
    settings: Settings, engine: Engine, *, expected: int, timeout_s: float = 600.0
) -> None:
    """Run the views consumer on ``settings.topic`` until it applied ``expected`` events.

    Raises:
        BackupError: it stopped making progress for ``timeout_s``.
    """
    applied = 0
    deadline = time.monotonic() + timeout_s
    with ViewConsumer(settings, engine=engine) as consumer:
        while applied < expected:
            outcome = consumer.poll_once(0.5)
            if outcome is not None and outcome.messages:
                applied += outcome.messages
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise BackupError(
                    f"the views of the restored copy stopped at {applied:,} of "
                    f"{expected:,} events for {timeout_s:.0f} s"
                )
