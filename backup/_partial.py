"""Partial and point-in-time restore: a selection of runs brought back for an
investigation, into a target of its own that is kept.

The same rules as a drill: the backup is checked first, destructions (the cut's own and
any newer one that can be read) are applied before anything is written, and nothing of
production is touched but its access audit, which records who restored which runs and
why (so does the restored copy's).
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.backup._copy import RestoredCopy, Stages, restore_copy
from agent_blackbox.backup._drill import require_broker
from agent_blackbox.backup._errors import BackupCorrupt, BackupError
from agent_blackbox.backup._restore import Selection, table_rows
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._target import (
    Target,
    create_target,
    drop_target,
    target_engine,
)
from agent_blackbox.backup._trust import check_backup
from agent_blackbox.keystore import purpose_problem, record_access_txn
from agent_blackbox.schemas import CheckpointVerifier, Settings
from agent_blackbox.wiring import COMMAND_POOL

RESTORE_PREFIX = "blackbox_restore_"
_INTO = re.compile(r"[a-z][a-z0-9_]{0,23}")


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    """Which runs to bring back, from which cut, into which target, and why."""

    into: str
    """The target's name (its database, role and topic prefix: ``blackbox_restore_<into>``)."""
    purpose: str
    run_ids: frozenset[str] = frozenset()
    subject: str | None = None
    since: datetime | None = None
    at: datetime | None = None
    principal: str = ""
    trust_cut: int | None = None
    """The manifest number of the cut the operator vouches for (``--trust-cut``)."""

    def problem(self) -> str | None:
        """What makes the request unusable, or None."""
        if _INTO.fullmatch(self.into) is None:
            return (
                f"--into {self.into!r}: name the copy with 1 to 24 lower-case letters, digits "
                "and _, starting with a letter"
            )
        if not (self.run_ids or self.subject or self.since):
            return "say which runs to restore: --runs, --subject and/or --since"
        return purpose_problem(self.purpose)

    def admits(self, row: dict[str, Any], forgotten: frozenset[str] = frozenset()) -> bool:
        """Whether the cut's run row ``row`` is one asked for (every criterion given);
        ``forgotten``: the runs the ledger destroyed for the subject (their rows no
        longer name it)."""
        if self.run_ids and row["run_id"] not in self.run_ids:
            return False
        if self.subject is not None and not (
            self.subject in (row["subject_ids"] or ()) or row["run_id"] in forgotten
        ):
            return False
        return self.since is None or row["created_at"] >= self.since


@dataclass(slots=True)
class RestoreResult:
    """What a partial restore brought back, and where."""

    target: Target
    cut: str
    runs: list[str]
    copy: RestoredCopy
    stages: dict[str, float]


def restore_runs(
    production: Settings,
    store: BackupStore,
    request: RestoreRequest,
    *,
    verifier: CheckpointVerifier,
    say: Callable[[str], None] = lambda _line: None,
) -> RestoreResult:
    """Restore the runs ``request`` selects (see the module).

    Raises:
        BackupError: a bad request, nothing matched, or the backup failed its check
            (the problems are named); the target is not left half made.
    """
    if (problem := request.problem()) is not None:
        raise BackupError(problem)
    stage = Stages(say)
    with stage("check the backup"):
        check = check_backup(
            production, store, verifier, at=request.at, trust_cut=request.trust_cut
        )
    cut = check.cut
    if cut is None or check.problems:
        found = "; ".join(f"{p.where}: {p.problem}" for p in check.problems[:5])
        raise BackupCorrupt(f"the backup failed its check, nothing is restored: {found}")
    for waived in check.waived:
        say(f"restoring {cut.key} as told although {waived.where}: {waived.problem}")
    forgotten = frozenset(
        str(r["run_id"])
        for r in table_rows(store, cut, "deletion_ledger")
        if request.subject is not None and r["subject_id"] == request.subject
    )
    rows = [r for r in table_rows(store, cut, "runs") if request.admits(r, forgotten)]
    if not rows:
        raise BackupError(f"no run of cut {cut.key} matches the selection")
    selection = Selection(frozenset(str(r["run_id"]) for r in rows))
    require_broker(production)
    with stage("create the target"):
        target = create_target(
            production, RESTORE_PREFIX + request.into, partitions=len(cut.positions)
        )
    engine = target_engine(target)
    try:
        copy = restore_copy(
            production,
            store,
            check,
            target,
            engine,
            verifier=verifier,
            stage=stage,
            selection=selection,
        )
        _audit(engine, rows, request, outcome="restored from backup")
    except BaseException:
        engine.dispose()
        drop_target(production, target)
        raise
    engine.dispose()
    _audit_production(production, rows, request, target, say)
    return RestoreResult(target, cut.key, sorted(selection.run_ids or ()), copy, stage.times)


def _audit(
    engine: Engine, rows: Iterable[dict[str, Any]], request: RestoreRequest, *, outcome: str
) -> None:
    principal = request.principal or getpass.getuser()
    with engine.begin() as conn:
        for row in rows:
            record_access_txn(
                conn,
                principal=principal,
                purpose=request.purpose,
                run_id=str(row["run_id"]),
                tenant_id=str(row["tenant_id"]),
                outcome=outcome,
            )


def _audit_production(
    production: Settings,
    rows: list[dict[str, Any]],
    request: RestoreRequest,
    target: Target,
    say: Callable[[str], None],
) -> None:
    engine = COMMAND_POOL.engine(production.database_url)
    try:
        _audit(engine, rows, request, outcome=f"restored from backup into {target.name}")
    except SQLAlchemyError as exc:
        say(f"the production access audit could not be written: {str(exc).splitlines()[0]}")
    finally:
        engine.dispose()
