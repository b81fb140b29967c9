"""The restore drill: a full rehearsal of a disaster recovery that leaves production alone.

:func:`run_drill` goes through these stages, timing each:

1. **check** the backup where it is, as ``backup verify`` does (:func:`check_backup`):
   the manifest chain up to the cut, its signatures, every object's SHA-256 and
   contents, and that no manifest was removed from the store's end (a backup that fails
   stops the drill here: nothing is restored from objects that are not the ones
   written, nor from a store that lost its newest cuts, unless told which to trust);
2. **target**: a new database with a role of its own and a new topic prefix;
3. **ledger and rows**: destructions newer than the cut are gathered first (the
   production database's ledger and the ``run.redacted`` notes after the cut, when
   they can be read), then the key rows are written with every destruction applied,
   and the notes are re-applied (authenticated as ``blackbox ledger reapply`` does);
4. **blobs** and **events** into the target;
5. **views** rebuilt from the restored topic by the normal views consumer;
6. **verify**: counts per partition against the manifests, distinct events per run
   (a re-delivered copy counted once and reported as a figure; a conflicting copy of a
   run's sequence fails), contiguous sequences, every data key and blob the events
   name, ``blackbox verify --all`` on the copy (digests, chains, signed checkpoints),
   the views equal to production's at the cut, forgotten runs without a live key, a
   sample of runs replayed (drawn from the agents with an entry point; the others'
   runs counted as skipped);
7. the target is dropped unless asked to keep it.

The report gives RPO (the disaster point minus the cut's newest event) and RTO (the
restored copy verified, minus the start), per stage times, and every failed check with
the object, offset or run it concerns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent_blackbox.backup._copy import Stages, restore_copy
from agent_blackbox.backup._drill_checks import Check, DrillChecks
from agent_blackbox.backup._errors import BackupError
from agent_blackbox.backup._manifest import Manifest
from agent_blackbox.backup._newer import NewerDeletions
from agent_blackbox.backup._restore import (
    RestoredTables,
)
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._target import (
    Target,
    create_target,
    drop_target,
    target_engine,
    target_name,
)
from agent_blackbox.backup._trust import TRUST_CUT_OPTION, check_backup
from agent_blackbox.backup._verify import StoreCheck
from agent_blackbox.broker import broker_answers, new_admin
from agent_blackbox.consumers import LedgerReport
from agent_blackbox.schemas import (
    CheckpointVerifier,
    Settings,
)

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DrillOptions:
    """How to run a drill."""

    at: datetime | None = None
    """The disaster point: the cut is the last one at or before it (None: now, newest)."""
    sample: int = 20
    """Runs to replay on the restored copy (0: none)."""
    keep: bool = False
    """Leave the target in place afterwards (its name is in the report)."""
    purpose: str = "restore drill"
    """Why the sample's bodies are read (written to the restored copy's access audit)."""
    trust_cut: int | None = None
    """The manifest number of the cut the operator vouches for: restore it even though
    the store's newest manifests were removed (see :func:`check_backup`)."""
    agents: tuple[str, ...] = ()
    """Entry points for the replay sample besides ``BLACKBOX_AGENTS`` (``--agent``:
    ``module:function`` for every agent, ``name=module:function`` for one)."""


@dataclass(slots=True)
class DrillReport:
    """What a drill did and found."""

    started_at: datetime
    disaster_point: datetime
    cut: str | None = None
    cut_created_at: str | None = None
    last_event_at: datetime | None = None
    target: str | None = None
    kept: bool = False
    events: int = 0
    """Distinct events of the cut (the manifests' message count until it is restored)."""
    runs: int = 0
    duplicates: int = 0
    """Re-delivered copies among the restored messages, each counted once in ``events``."""
    skipped: int = 0
    """Runs the replay sample skipped: their agents have no entry point."""
    stages: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    rto_s: float | None = None
    left_behind: list[str] = field(default_factory=list)
    kept_target: Target | None = None
    """The restored copy, when the drill was asked to keep it."""

    @property
    def rpo_s(self) -> float | None:
        """Seconds between the disaster point and the newest event the cut holds."""
        if self.last_event_at is None:
            return None
        return max(0.0, (self.disaster_point - self.last_event_at).total_seconds())

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed is not False for c in self.checks)

    @property
    def unrun(self) -> bool:
        """Failed only for want of a service or a setting: no check found anything."""
        failed = [c for c in self.checks if c.passed is False]
        return bool(failed) and all(c.unrun for c in failed)

    def add(self, check: Check) -> None:
        self.checks.append(check)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "could_not_run": self.unrun,
            "started_at": self.started_at.isoformat(),
            "disaster_point": self.disaster_point.isoformat(),
            "cut": self.cut,
            "cut_created_at": self.cut_created_at,
            "last_event_at": None if self.last_event_at is None else self.last_event_at.isoformat(),
            "rpo_s": self.rpo_s,
            "rto_s": self.rto_s,
            "target": self.target,
            "kept": self.kept,
            "events": self.events,
            "runs": self.runs,
            "duplicates": self.duplicates,
            "skipped": self.skipped,
            "stages_s": {k: round(v, 3) for k, v in self.stages.items()},
            "checks": [
                {
                    "name": c.name,
                    "passed": c.passed,
                    "could_not_run": c.unrun,
                    "detail": c.detail,
                    "where": list(c.where),
                }
                for c in self.checks
            ],
            "left_behind": self.left_behind,
        }


def run_drill(
    production: Settings,
    store: BackupStore,
    *,
    verifier: CheckpointVerifier,
    options: DrillOptions = DrillOptions(),
    say: Say = lambda _line: None,
) -> DrillReport:
    """Rehearse a restore of ``store``'s cut (see the module) and report.

    Raises:
        BackupError: the drill could not run at all (no backup, no way to make a target).
    """
    started = time.monotonic()
    report = DrillReport(
        started_at=datetime.now(UTC), disaster_point=options.at or datetime.now(UTC)
    )
    stage = Stages(say)
    report.stages = stage.times
    with stage("check the backup"):
        check = check_backup(
            production, store, verifier, at=options.at, trust_cut=options.trust_cut
        )
    cut = check.cut
    if cut is not None:
        _describe_cut(report, check, cut)
    report.add(_backup_check(check))
    if cut is None or check.problems:
        say("the backup failed its check: nothing is restored from it")
        return report
    require_broker(production)
    with stage("create the target"):
        target = create_target(production, target_name(), partitions=len(cut.positions))
    report.target = target.describe()
    try:
        _restore_and_verify(production, store, check, target, verifier, options, stage, report)
        report.rto_s = time.monotonic() - started
    finally:
        if options.keep:
            report.kept = True
            report.kept_target = target
        else:
            with stage("drop the target"):
                report.left_behind = drop_target(production, target)
    return report


def _restore_and_verify(
    production: Settings,
    store: BackupStore,
    check: StoreCheck,
    target: Target,
    verifier: CheckpointVerifier,
    options: DrillOptions,
    stage: Stages,
    report: DrillReport,
) -> None:
    engine = target_engine(target)
    try:
        copy = restore_copy(
            production, store, check, target, engine, verifier=verifier, stage=stage
        )
        report.add(_ledger_check(copy.tables, copy.newer, copy.ledger))
        report.events, report.duplicates = copy.events, copy.tally.duplicates
        with stage("verify the restored copy"):
            checks = DrillChecks(
                production, target, engine, check, copy.tally, agents=options.agents
            )
            for found in checks.all(copy.tables, sample=options.sample, purpose=options.purpose):
                report.add(found)
        report.skipped = checks.skipped
    finally:
        engine.dispose()


def require_broker(production: Settings) -> None:
    """Raise :class:`BackupError` unless the broker answers."""
    # Before a copy is made: without a broker it could not be filled, and would only
    # be made and dropped again after a long wait.
    # The probe's own connection failures are what the error below says; not logged.
    probe = new_admin(production.kafka_bootstrap, {"log_level": 0})
    if not broker_answers(probe, timeout_s=10.0):
        raise BackupError(
            f"Kafka at {production.kafka_bootstrap} does not answer; the restored events go "
            "to a topic there: check that it runs and BLACKBOX_KAFKA_BOOTSTRAP"
        )


def _describe_cut(report: DrillReport, check: StoreCheck, cut: Manifest) -> None:
    report.cut = cut.key
    report.cut_created_at = cut.created_at
    report.events = check.messages
    report.runs = len(check.heads)
    if check.last_event_ms is not None:
        report.last_event_at = datetime.fromtimestamp(check.last_event_ms / 1000, UTC)


def _backup_check(check: StoreCheck) -> Check:
    chain = check.chain
    detail = (
        f"{len(chain.manifests)} signed manifests, {check.segments} segments, "
        f"{check.messages:,} events, {check.blobs} blobs"
    )
    where = tuple(f"{p.where}: {p.problem}" for p in check.problems[:20])
    if check.waived:
        detail += f"; restored as told ({TRUST_CUT_OPTION}) although " + "; ".join(
            f"{p.where}: {p.problem}" for p in check.waived[:3]
        )
    if check.unchecked:
        detail += "; " + "; ".join(check.unchecked)
    return Check("backup objects and manifest chain", not check.problems, detail, where)


def _ledger_check(tables: RestoredTables, newer: NewerDeletions, ledger: LedgerReport) -> Check:
    applied = [
        f"run {run} key {key}: destroyed after the cut" for run, key in tables.destroyed_after_cut
    ]
    ignored = [f"run {i.entry.run_id}: note not applied: {i.why}" for i in ledger.ignored]
    detail = (
        f"{tables.rows.get('deletion_ledger', 0)} entries in the cut; "
        f"{len(newer.rows)} newer ledger entries and {len(newer.notes)} newer notes "
        f"(read from: {', '.join(newer.read) or 'nothing'}); "
        f"{len(tables.destroyed_after_cut)} keys destroyed before restore, "
        f"{len(ledger.destroyed)} more by re-applied notes"
    )
    if newer.unread:
        detail += f"; not read: {'; '.join(newer.unread)}"
    where = tuple(ignored + applied)[:20]
    return Check("deletion ledger applied first", not ignored, detail, where)
