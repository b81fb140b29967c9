"""The read side's keeping of replay results (the replayer's ``ReplayResults`` port)."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.consumers._errors import ViewStoreUnavailable


class _Divergence(Protocol):
    @property
    def kind(self) -> object: ...
    @property
    def sequence(self) -> int: ...


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


# The tenant and the recorded code version come from the runs view in the same
# statement: a role records results only of runs it may read (row security), and a run
# the views do not know is not recorded.
_RECORD = text(
    """
    INSERT INTO blackbox_views.replay_results
        (run_id, tenant_id, agent_id, recorded_code_version, code_version, result, passed,
         divergence_kind, divergence_sequence, events, duration_ms)
    SELECT r.run_id, r.tenant_id, r.agent_id, r.code_version, :code_version, :result,
           :passed, :kind, :sequence, :events, :duration_ms
      FROM blackbox_views.runs r
     WHERE r.run_id = :run_id
    """
)


class ViewReplayResults:
    """Writes each replayed run's result to ``blackbox_views.replay_results``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def record(self, report: _Report, *, code_version: str | None) -> None:
        """Keep ``report`` as the result of replaying its run with ``code_version``.

        Raises:
            ViewStoreUnavailable: the database refused the row.
        """
        divergence = report.divergence
        params = {
            "run_id": report.run_id,
            "code_version": code_version,
            "result": report.result,
            "passed": report.result in ("PASS", "LIMITED"),
            "kind": None if divergence is None else str(getattr(divergence.kind, "value", "")),
            "sequence": None if divergence is None else divergence.sequence,
            "events": report.events,
            "duration_ms": report.duration_ms,
        }
        try:
            with self._engine.begin() as conn:
                conn.execute(_RECORD, params)
        except SQLAlchemyError as exc:
            raise ViewStoreUnavailable(
                f"cannot record the replay result of run {report.run_id}: "
                f"{str(exc).splitlines()[0]}"
            ) from exc
