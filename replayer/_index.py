"""The run index: how the replayer finds recorded runs without knowing where they are kept.

The read side implements it (:class:`~agent_blackbox.consumers.ViewRunIndex`, over its
events index) and the ``blackbox`` command wires it in; the replayer itself never reads
the read side's tables. Anything with these methods is a run index: a test's dict, an
index of another store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import Engine

from agent_blackbox.broker import GrantedEpochs
from agent_blackbox.replayer._report import ReplayReport
from agent_blackbox.schemas import Checkpoint


class RunLocation(Protocol):
    """Where a run's events are: one partition of one topic, between two offsets."""

    @property
    def run_id(self) -> str: ...

    @property
    def agent_id(self) -> str | None: ...

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def first_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    @property
    def events(self) -> int: ...

    @property
    def unverified(self) -> frozenset[int]:
        """The sequences of the run's events the write side does not vouch for (produced
        to the topic by someone other than the relay): a reader that shows or exports
        the run leaves them out unless asked for them."""
        ...


class RunIndex(Protocol):
    """What the read side knows of recorded runs."""

    def locate(self, run_id: str) -> RunLocation | None:
        """Where ``run_id`` is in the topic; None when it is not indexed.

        Raises:
            BlackboxError: the index cannot be read, or the run is spread over more
                than one partition.
        """
        ...

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
        """The ids of indexed runs, oldest first.

        Args:
            finished_only: leave out runs that are still running.
            since: only runs started at or after this time.
            agent_id: only runs of this agent.
            limit: at most this many ids.
            include_forks: with False, leave out forks (runs whose ``run.started``
                names a ``parent_run_id``).
            random: ``limit`` ids drawn at random from those that match, not the
                oldest (still given oldest first).
        """
        ...

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The signed checkpoint of ``run_id``, when one was signed."""
        ...

    def granted_epochs(self) -> GrantedEpochs | None:
        """The write side's granted lease epochs, for the fences of the runs read through
        this index (one for all of them); None when there is no write side to ask."""
        ...


class ReplayResults(Protocol):
    """Where a batch replay keeps each run's result (the read side's ``replay_results``),
    so a pass rate per code version is a query."""

    def record(self, report: ReplayReport, *, code_version: str | None) -> None:
        """Keep ``report`` as the result of replaying its run with ``code_version``."""
        ...

    def record_many(self, reports: Sequence[ReplayReport], *, code_version: str | None) -> None:
        """Keep ``reports``, in their order, in one transaction: all or none."""
        ...


@dataclass(frozen=True, slots=True)
class ReadSide:
    """How the replayer's commands reach the read side: a run index over a database,
    and where replay results go. The ``blackbox`` command's composition root builds one
    over the views (``agent_blackbox.cli``); the replayer never imports the read side."""

    run_index: Callable[[Engine], RunIndex]
    replay_results: Callable[[Engine], ReplayResults] | None = None
