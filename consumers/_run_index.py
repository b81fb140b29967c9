"""The run index over the views: where each run is in the topic, which runs there are,
their signed checkpoints. The replayer reads runs through it (its ``RunIndex`` port).

A run lives on the partition its key maps to. The views consumer never indexes an
event found elsewhere; an index built before it flagged them may still hold such
events, and then the run's own partition is the one read (with the topic's partition
count, when the index was given a way to learn it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.broker import GrantedEpochs, run_partition
from agent_blackbox.broker import partition_count as topic_partitions
from agent_blackbox.consumers._checkpoints import load_checkpoint
from agent_blackbox.consumers._errors import ViewStoreUnavailable
from agent_blackbox.outbox.lifecycle import lease_epochs
from agent_blackbox.schemas import (
    BlackboxError,
    Checkpoint,
    PermissionRefused,
    Settings,
    driver_cause,
    permission_refused,
    safe_text,
)

_LOCATE = text(
    """
    SELECT topic, "partition", min("offset"), max("offset"), count(*), min(agent_id),
           array_agg(sequence ORDER BY sequence) FILTER (WHERE e.unverified IS NOT NULL)
      FROM blackbox_views.events e JOIN blackbox_views.runs r USING (run_id)
     WHERE run_id = :run_id
     GROUP BY topic, "partition"
    """
)

_MATCHING = """
    SELECT run_id, started_at FROM blackbox_views.runs
     WHERE (NOT :finished_only OR status <> 'running')
       AND (CAST(:since AS timestamptz) IS NULL OR started_at >= :since)
       AND (CAST(:agent AS text) IS NULL OR agent_id = :agent)
       AND (:include_forks OR parent_run_id IS NULL)
"""
_RUNS = text(f"SELECT run_id FROM ({_MATCHING}) m ORDER BY started_at, run_id LIMIT :limit")
_DRAWN = text(
    f"SELECT run_id FROM (SELECT * FROM ({_MATCHING}) m ORDER BY random() LIMIT :limit) d "
    "ORDER BY started_at, run_id"
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
    unverified: frozenset[int] = frozenset()
    """The sequences of its events the write side does not vouch for."""


class ViewRunIndex:
    """The run index of the views in ``engine`` (the events index and the runs view).

    Args:
        partition_count: the number of partitions of a topic (e.g.
            :func:`agent_blackbox.broker.partition_count`); asked only for a run the
            index holds on more than one partition, to pick the one its key maps to.
    """

    def __init__(
        self, engine: Engine, *, partition_count: Callable[[str], int] | None = None
    ) -> None:
        self._engine = engine
        self._partition_count = partition_count
        self._granted = GrantedEpochs(partial(lease_epochs, engine))

    @classmethod
    def from_settings(cls, engine: Engine, settings: Settings) -> ViewRunIndex:
        """The run index of the views in ``engine``, which asks the broker of
        ``settings`` for a topic's partition count when a run is indexed on several
        partitions (to read the one its key maps to)."""
        return cls(engine, partition_count=partial(topic_partitions, settings))

    def locate(self, run_id: str) -> IndexedRun | None:
        """Where ``run_id`` is; None when the events index does not know it.

        Raises:
            ViewStoreUnavailable: the index cannot be read.
            BlackboxError: the run is indexed on more than one partition, none of them
                the one its key maps to, or without a partition count to tell.
        """
        try:
            with self._engine.connect() as conn:
                rows = conn.execute(_LOCATE, {"run_id": run_id}).all()
        except SQLAlchemyError as exc:
            raise _unreadable("the events index", exc) from exc
        if not rows:
            return None
        topic, partition, first, last, count, agent_id, unverified = (
            rows[0] if len(rows) == 1 else self._own_partition(run_id, rows)
        )
        return IndexedRun(
            run_id,
            agent_id,
            str(topic),
            int(partition),
            int(first),
            int(last),
            int(count),
            frozenset(int(s) for s in unverified or ()),
        )

    def _own_partition(self, run_id: str, rows: Sequence[Any]) -> Any:
        """Of a run's rows on several partitions, the one on the partition its key maps to."""
        where = ", ".join(f"{safe_text(r[0])}[{r[1]}]" for r in rows)
        if self._partition_count is None:
            raise BlackboxError(
                f"run {safe_text(run_id)} is indexed on {len(rows)} partitions ({where}); "
                "events of it on a partition its key does not map to were not produced by "
                "the relay. Rebuild the views with `blackbox consume` (it flags such "
                "events) or read the index with a partition count"
            )
        for row in rows:
            if int(row[1]) == run_partition(run_id, self._partition_count(str(row[0]))):
                return row
        raise BlackboxError(
            f"run {safe_text(run_id)} is indexed on {len(rows)} partitions ({where}), none "
            "of them the one its key maps to; check the integrity violations of the views "
            "(blackbox_views.integrity_violations, kind wrong_partition)"
        )

    def runs(
        self,
        *,
        finished_only: bool,
        since: datetime | None = None,
        agent_id: str | None = None,
        limit: int = 100_000,
        include_forks: bool = True,
        random: bool = False,
    ) -> list[str]:
        """The ids of indexed runs (finished ones only, when asked; forks too unless
        ``include_forks`` is False; ``random``: a random draw of ``limit``), oldest
        first.

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
                statement = _DRAWN if random else _RUNS
                return [str(r) for r in conn.execute(statement, params).scalars()]
        except SQLAlchemyError as exc:
            raise _unreadable("the runs view", exc) from exc

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The signed checkpoint of ``run_id``, if the signer has signed one."""
        return load_checkpoint(self._engine, run_id)

    def granted_epochs(self) -> GrantedEpochs:
        """The lease epochs the write side in this database granted (asked at most once a
        second, by every run read through this index)."""
        return self._granted


def _unreadable(what: str, exc: SQLAlchemyError) -> BlackboxError:
    if refusal := permission_refused(exc):  # the login, not the database: say which
        return PermissionRefused(
            f"cannot read {what}: {refusal}; the views are read by a blackbox_reader or "
            "blackbox_replayer login (granted the runs' tenants)"
        )
    cause = driver_cause(exc)
    return ViewStoreUnavailable(
        f"cannot read {what}: {cause}. Check that Postgres runs (blackbox stack status) and "
        "BLACKBOX_DATABASE_URL points at it, and that the views were built (blackbox consume)"
    )
