"""The run index over the views: where each run is in the topic, which runs there are,
their signed checkpoints. The replayer reads runs through it (its ``RunIndex`` port)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.consumers._checkpoints import load_checkpoint
from agent_blackbox.consumers._errors import ViewStoreUnavailable
from agent_blackbox.schemas import BlackboxError, Checkpoint

_LOCATE = text(
    """
    SELECT topic, "partition", min("offset"), max("offset"), count(*), min(agent_id)
      FROM blackbox_views.events e JOIN blackbox_views.runs r USING (run_id)
     WHERE run_id = :run_id
     GROUP BY topic, "partition"
    """
)

_RUNS = text(
    """
    SELECT run_id FROM blackbox_views.runs
     WHERE (NOT :finished_only OR status <> 'running')
       AND (CAST(:since AS timestamptz) IS NULL OR started_at >= :since)
       AND (CAST(:agent AS text) IS NULL OR agent_id = :agent)
       AND (:include_forks OR parent_run_id IS NULL)
     ORDER BY started_at, run_id
     LIMIT :limit
    """
)


@dataclass(frozen=True, slots=True)
class IndexedRun:
    """Where a run's events are: one partition, from its first to its last offset."""

    run_id: str
    agent_id: str | None
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    events: int


class ViewRunIndex:
    """The run index of the views in ``engine`` (the events index and the runs view)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def locate(self, run_id: str) -> IndexedRun | None:
        """Where ``run_id`` is; None when the events index does not know it.

        Raises:
            ViewStoreUnavailable: the index cannot be read.
            BlackboxError: the run is indexed on more than one partition.
        """
        try:
            with self._engine.connect() as conn:
                rows = conn.execute(_LOCATE, {"run_id": run_id}).all()
        except SQLAlchemyError as exc:
            raise _unreadable("the events index", exc) from exc
        if not rows:
            return None
        if len(rows) > 1:
            raise BlackboxError(f"run {run_id} is indexed on {len(rows)} partitions; expected one")
        topic, partition, first, last, count, agent_id = rows[0]
        return IndexedRun(
            run_id, agent_id, str(topic), int(partition), int(first), int(last), int(count)
        )

    def runs(
        self,
        *,
        finished_only: bool,
        since: datetime | None = None,
        agent_id: str | None = None,
        limit: int = 100_000,
        include_forks: bool = True,
    ) -> list[str]:
        """The ids of indexed runs (finished ones only, when asked; forks too unless
        ``include_forks`` is False), oldest first.

        Raises:
            ViewStoreUnavailable: the runs view cannot be read.
        """
        params = {
            "finished_only": finished_only,
            "since": since,
            "agent": agent_id,
            "limit": limit,
            "include_forks": include_forks,
        }
        try:
            with self._engine.connect() as conn:
                return [str(r) for r in conn.execute(_RUNS, params).scalars()]
        except SQLAlchemyError as exc:
            raise _unreadable("the runs view", exc) from exc

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The signed checkpoint of ``run_id``, if the signer has signed one."""
        return load_checkpoint(self._engine, run_id)


def _unreadable(what: str, exc: SQLAlchemyError) -> ViewStoreUnavailable:
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return ViewStoreUnavailable(
        f"cannot read {what}: {cause}. Check that Postgres runs (blackbox stack status) and "
        "BLACKBOX_DATABASE_URL points at it, and that the views were built (blackbox consume)"
    )
