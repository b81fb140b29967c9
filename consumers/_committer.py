"""A sorted batch's way into the database: its poison acknowledged by the dead-letter
topic first, then one transaction that advances the stored offsets and applies the
projection, so the offsets commit with the rows they produced or not at all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agent_blackbox.broker import ClientConfig
from agent_blackbox.consumers._batch import BatchOutcome, Projection
from agent_blackbox.consumers._dead_letters import DeadLetterWriter
from agent_blackbox.consumers._offsets import OffsetMove, advance_offsets
from agent_blackbox.consumers._sorting import Batch
from agent_blackbox.consumers._view_database import ViewDatabase
from agent_blackbox.schemas import Settings


class BatchCommitter:
    """Commits sorted batches of one consumer group with its projection.

    Args:
        settings: the dead-letter topic and its broker.
        projection: applies a batch's records in the batch's transaction.
        database: where the views and the offsets live.
        group_id: the consumer group whose offsets advance.
        client_config: extra settings of the dead-letter producer.
    """

    def __init__(
        self,
        settings: Settings,
        projection: Projection,
        *,
        database: ViewDatabase,
        group_id: str,
        client_config: ClientConfig,
    ) -> None:
        self._settings = settings
        self._projection = projection
        self._database = database
        self._group_id = group_id
        self._client_config = client_config
        self._dead_letters: DeadLetterWriter | None = None

    def open(self) -> None:
        """Start the dead-letter producer (once: a member that joins again keeps it)."""
        if self._dead_letters is None:
            self._dead_letters = DeadLetterWriter(self._settings, client_config=self._client_config)

    def commit(self, batch: Batch, moves: Sequence[OffsetMove]) -> BatchOutcome:
        """1. DLQ acknowledged. 2. Offsets CAS. 3. Projection. 4. Commit.

        Touches no state of the reading thread: the pipeline calls it on its worker.

        Raises:
            DeadLetterFailed: a poison message was not acknowledged; nothing committed.
            OffsetsMoved: another consumer advanced a partition; rolled back.
            ViewStoreUnavailable, ViewsNotMigrated, ProjectionFailed: see
                :meth:`ViewDatabase.transaction`; rolled back.
        """
        assert self._dead_letters is not None, "open() first"
        self._dead_letters.send(batch.poison)
        with self._database.transaction() as conn:
            advance_offsets(conn, group_id=self._group_id, moves=moves)
            outcome = self._projection(conn, batch.records) if batch.records else BatchOutcome()
        return replace(outcome, dead_lettered=len(batch.poison), stale=batch.stale)

    def close(self) -> None:
        """Deliver what the dead-letter producer still holds and stop it."""
        if self._dead_letters is not None:
            self._dead_letters.close()
