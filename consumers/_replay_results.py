"""The read side's keeping of replay results (the replayer's ``ReplayResults`` port)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.consumers._errors import ViewStoreUnavailable
from agent_blackbox.schemas import driver_cause


class _Divergence(Protocol):
    @property
    def kind(self) -> object: ...
    @property
    def sequence(self) -> int: ...
    @property
    def summary(self) -> str: ...


class _Kept(Protocol):
    @property
    def data(self) -> bytes: ...
    @property
    def key_id(self) -> str | None: ...


class _Report(Protocol):
    """What is kept of a replay report (the replayer's ``ReplayReport`` has it; the read
    side does not import the replayer)."""

    @property
    def run_id(self) -> str: ...
    @property
    def result(self) -> str: ...
    @property
    def divergence(self) -> _Divergence | None: ...
    @property
    def events(self) -> int: ...
    @property
    def duration_ms(self) -> float | None: ...
    @property
    def kept(self) -> _Kept | None: ...


@dataclass(frozen=True, slots=True)
class KeptRow:
    """The values a replay result kept, and where they belong (see the replayer's
    ``open_kept_values``)."""

    data: bytes
    key_id: str | None
    run_id: str
    tenant_id: str
    sequence: int


# The checked function is the only way in (revision 0022): it takes the tenant, agent
# and recorded code version from the runs view, refuses a run outside the caller's
# tenant grant, and derives ``passed`` from the result.
_RECORD = text(
    "SELECT blackbox_views.record_replay_result(:run_id, :code_version, :result, :kind, "
    ":sequence, :events, :duration_ms, :detail, :values, :values_key_id)"
)
_KEPT = text(
    "SELECT divergence_values, values_key_id, run_id, tenant_id, divergence_sequence "
    "FROM blackbox_views.replay_results WHERE id = :id AND run_id = :run_id "
    "AND divergence_values IS NOT NULL"
)


class ViewReplayResults:
    """Writes each replayed run's result to ``blackbox_views.replay_results``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def record(self, report: _Report, *, code_version: str | None) -> None:
        """Keep ``report`` as the result of replaying its run with ``code_version``: the
        divergence in words, and the values behind it when the report kept them.

        Raises:
            ViewStoreUnavailable: the database refused the row (the run is not in the
                views, or not in a tenant this login is granted).
        """
        self.record_many([report], code_version=code_version)

    def record_many(self, reports: Sequence[_Report], *, code_version: str | None) -> None:
        """Keep ``reports`` in their order, as :meth:`record` keeps one, in one
        transaction: all of them or, when the database refuses one, none.

        Raises:
            ViewStoreUnavailable: the database refused a row (its run is named).
        """
        if not reports:
            return
        rows = [_params(report, code_version) for report in reports]
        try:
            with self._engine.begin() as conn:
                # Several rows go as one pipelined batch: a round trip for the batch,
                # not one per run (what bounded ``replay --all`` over short runs).
                conn.execute(_RECORD, rows if len(rows) > 1 else rows[0])
        except SQLAlchemyError as exc:
            detail = driver_cause(exc)
            which = reports[0].run_id if len(reports) == 1 else _named(exc, reports)
            raise ViewStoreUnavailable(
                f"cannot record the replay result of run {which}: {detail}"
            ) from exc


def _params(report: _Report, code_version: str | None) -> dict[str, object]:
    divergence = report.divergence
    kept = report.kept
    return {
        "run_id": report.run_id,
        "code_version": code_version,
        "result": report.result,
        "kind": None if divergence is None else str(getattr(divergence.kind, "value", "")),
        "sequence": None if divergence is None else divergence.sequence,
        "events": report.events,
        "duration_ms": report.duration_ms,
        "detail": None if divergence is None else divergence.summary[:4000],
        "values": None if kept is None else kept.data,
        "values_key_id": None if kept is None else kept.key_id,
    }


def _named(exc: SQLAlchemyError, reports: Sequence[_Report]) -> str:
    """The run a refused batch stopped at, when the database's message names it."""
    message = str(getattr(exc, "orig", None) or exc)
    named = [r.run_id for r in reports if r.run_id in message]
    return named[0] if named else f"{reports[0].run_id} (or one of the {len(reports) - 1} after it)"


def kept_values_txn(conn: Connection, run_id: str, result_id: int) -> KeptRow | None:
    """The values replay result ``result_id`` of ``run_id`` kept; None when it kept none
    (or the login's tenants do not cover the run). Readable by replayer logins only."""
    row = conn.execute(_KEPT, {"id": result_id, "run_id": run_id}).first()
    if row is None:
        return None
    return KeptRow(bytes(row[0]), row[1], row[2], row[3], int(row[4]))


def forget_replay_values_txn(conn: Connection, run_ids: list[str]) -> None:
    """Clear the values the replay results of ``run_ids`` kept (a sealed run's are
    shredded with its keys anyway). The caller commits."""
    if run_ids:
        conn.execute(
            text(
                "UPDATE blackbox_views.replay_results SET divergence_values = NULL, "
                "values_key_id = NULL, values_kept = false "
                "WHERE run_id = ANY(:ids) AND divergence_values IS NOT NULL"
            ),
            {"ids": run_ids},
        )
