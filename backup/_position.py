"""How far the backup to a store got, as the database records it, and where a writer
that starts resumes: the store's newest manifest, checked against that record.

The record is the consumer offsets of the store's group, advanced by compare-and-set
after each manifest is written (as the views' offsets are), so a second writer that
moved them makes the first one stop instead of writing a diverging chain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.backup._errors import BackupDiverged, BackupError, first_line
from agent_blackbox.backup._manifest import LostRange, Manifest
from agent_blackbox.consumers import OffsetMove, OffsetsMoved, advance_offsets, load_offsets


class BackupPosition:
    """The backup's offsets in the database, per partition of its topic.

    Args:
        engine: the production database.
        topic: the topic backed up.
        group_id: the consumer group the offsets are kept under (one per store).
        store: the store's description, for the messages.
    """

    def __init__(self, engine: Engine, *, topic: str, group_id: str, store: str) -> None:
        self._engine = engine
        self._topic = topic
        self._group_id = group_id
        self._store = store
        self.stored: dict[int, int | None] = {}
        """Partition -> the next offset the database records (``None``: nothing)."""

    def resume(
        self, head: Manifest | None, lows: Mapping[int, int]
    ) -> tuple[dict[int, int], list[LostRange]]:
        """Where to start reading each partition of ``lows`` (the topic's low
        watermarks), after ``head``, the store's newest manifest; and the ranges the
        topic dropped before they were read. The record is moved up to ``head`` where
        a crash left it behind.

        Raises:
            BackupDiverged: the record and the store disagree.
            BackupError: the database could not be read or written.
        """
        self._load(lows)
        if head is None:
            if any(v is not None for v in self.stored.values()):
                raise BackupDiverged(
                    f"the database records backing up {self._topic} to "
                    f"{_describe(self.stored)}, but {self._store} holds no "
                    "manifest: the store was emptied or is not the one backed up to. Point "
                    "BLACKBOX_BACKUP_URL at the right store, or at a new prefix to start a "
                    "new backup series"
                )
            return dict(lows), []
        self._check(head)
        read = {p: head.positions.get(p, lows[p]) for p in lows}
        lost: list[LostRange] = []
        for p, low in lows.items():
            if low > read[p]:
                lost.append(LostRange(p, read[p], low))
                read[p] = low
        self.advance(head.positions)
        return read, lost

    def advance(self, positions: Mapping[int, int]) -> None:
        """Record ``positions`` (partition -> next offset), compare-and-set.

        Raises:
            BackupDiverged: another writer moved the offsets.
            BackupError: the database could not be written.
        """
        moves = [
            OffsetMove(self._topic, p, expected=self.stored.get(p), next_offset=o)
            for p, o in sorted(positions.items())
            if self.stored.get(p) != o
        ]
        if not moves:
            return
        try:
            self._moved(moves)
        except OffsetsMoved as exc:
            # Found, not a rival's: an earlier attempt of this very move that committed
            # with its reply lost, or offsets of this writer's that the database lost (a
            # failover to a standby that had not received them: a rival only moves them
            # forward), stored again from where the database is.
            found = self._stored(positions)
            if not self._own(found, positions):
                raise self._diverged(exc) from exc
            again = [
                OffsetMove(self._topic, p, expected=found[p], next_offset=o)
                for p, o in sorted(positions.items())
                if found[p] != o
            ]
            try:
                if again:
                    self._moved(again)
            except OffsetsMoved as rival:
                raise self._diverged(rival) from rival
        self.stored.update(positions)

    def _diverged(self, moved: OffsetsMoved) -> BackupDiverged:
        return BackupDiverged(f"another backup writer moved the offsets of {self._store}: {moved}")

    def _moved(self, moves: list[OffsetMove]) -> None:
        """Advance ``moves`` in one transaction.

        Raises:
            OffsetsMoved: a partition is not where a move expects it.
            BackupError: the database could not be written.
        """
        try:
            with self._engine.begin() as conn:
                advance_offsets(conn, group_id=self._group_id, moves=moves)
        except SQLAlchemyError as exc:
            raise BackupError(f"cannot store the backup's offsets: {first_line(exc)}") from exc

    def _own(self, found: Mapping[int, int | None], positions: Mapping[int, int]) -> bool:
        """Whether every offset the database records (``found``, read after a
        compare-and-set failed) is this writer's: the one it stored, an earlier one (its
        later writes were lost), or the one it is moving to (that move committed)."""
        for p, offset in found.items():
            mine = self.stored.get(p)
            if offset is None or offset == positions[p]:
                continue
            if mine is None or offset > mine:
                return False
        return True

    def _load(self, lows: Mapping[int, int]) -> None:
        self.stored = self._stored(lows)

    def _stored(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """The offsets the database stores for the backup's ``partitions``.

        Raises:
            BackupError: the database could not be read.
        """
        wanted = [(self._topic, p) for p in sorted(partitions)]
        try:
            with self._engine.connect() as conn:
                stored = load_offsets(conn, group_id=self._group_id, partitions=wanted)
        except SQLAlchemyError as exc:
            raise BackupError(f"cannot read the backup's offsets: {first_line(exc)}") from exc
        return {p: stored[(topic, p)] for topic, p in wanted}

    def _check(self, head: Manifest) -> None:
        """The store's newest manifest is of this topic and not behind the record."""
        if head.topic != self._topic:
            raise BackupDiverged(
                f"{self._store} holds a backup of topic {head.topic}, not "
                f"{self._topic}; give each topic its own store or prefix"
            )
        ahead = {
            p: v for p, v in self.stored.items() if v is not None and v > head.positions.get(p, 0)
        }
        if ahead:
            raise BackupDiverged(
                f"the database records backing up {self._topic} to {_describe(ahead)}, "
                f"past the newest manifest in {self._store} "
                f"({head.key}): manifests were removed from the store. Find out why before "
                "backing up again (a new prefix starts a new series)"
            )


def _describe(offsets: Mapping[int, int | None]) -> str:
    return ", ".join(f"[{p}]@{o}" for p, o in sorted(offsets.items()) if o is not None)
