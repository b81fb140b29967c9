"""Kafka offsets kept in Postgres, in the same transaction as the rows they produced.

Beside each offset lies the consumer's epoch fence for that partition (the newest relay
lease epoch read per outbox shard), written by the same statement, so the offset and
the judgement of what is stale move together.

Every advance is a compare-and-set against the value this consumer last read or
wrote. If another member of the group (a zombie that missed a rebalance, say) moved
a partition in between, the advance fails, the whole transaction rolls back, and
the consumer rewinds to what is stored: two writers can never both apply a batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, bindparam, func, select, update
from sqlalchemy.dialects import postgresql as pg

from agent_blackbox.consumers._errors import ConsumerError
from agent_blackbox.consumers._tables import consumer_offsets

TopicPartition = tuple[str, int]
"""``(topic, partition)``."""


class OffsetsMoved(ConsumerError):
    """Another consumer advanced a partition since this one last read its offset."""

    def __init__(self, group_id: str, move: OffsetMove) -> None:
        self.move = move
        super().__init__(
            f"group {group_id!r} offset of {move.topic}[{move.partition}] is no longer "
            f"{move.expected}; another consumer advanced it. This batch was rolled back "
            "and the consumer rewinds to the stored offset"
        )


@dataclass(frozen=True, slots=True)
class OffsetMove:
    """Advance one partition from ``expected`` (``None``: nothing stored yet) to
    ``next_offset``, storing ``lease_epochs`` (shard -> newest epoch) beside it."""

    topic: str
    partition: int
    expected: int | None
    next_offset: int
    lease_epochs: Mapping[int, int] = field(default_factory=dict)


def load_offsets(
    conn: Connection, *, group_id: str, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, int | None]:
    """The stored next offset of each partition, ``None`` where nothing is stored."""
    wanted = sorted(set(partitions))
    found: dict[TopicPartition, int | None] = dict.fromkeys(wanted)
    if not wanted:
        return found
    c = consumer_offsets.c
    query = select(c.topic, c.partition, c.next_offset).where(
        c.group_id == group_id,
        c.topic.in_({topic for topic, _ in wanted}),
        c.partition.in_({partition for _, partition in wanted}),
    )
    for topic, partition, next_offset in conn.execute(query):
        if (topic, partition) in found:
            found[(topic, partition)] = next_offset
    return found


def load_fences(
    conn: Connection, *, group_id: str, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, dict[int, int]]:
    """The stored fence of each partition (shard -> newest epoch), empty where none."""
    wanted = sorted(set(partitions))
    found: dict[TopicPartition, dict[int, int]] = {tp: {} for tp in wanted}
    if not wanted:
        return found
    c = consumer_offsets.c
    query = select(c.topic, c.partition, c.lease_epochs).where(
        c.group_id == group_id,
        c.topic.in_({topic for topic, _ in wanted}),
        c.partition.in_({partition for _, partition in wanted}),
    )
    for topic, partition, epochs in conn.execute(query):
        if (topic, partition) in found:
            found[(topic, partition)] = {int(shard): int(e) for shard, e in epochs.items()}
    return found


def advance_offsets(conn: Connection, *, group_id: str, moves: Sequence[OffsetMove]) -> None:
    """Compare-and-set each partition's offset; the caller commits.

    Partitions are advanced in sorted order so concurrent writers lock rows in the
    same order and cannot deadlock. The advances of partitions that already hold an
    offset (every batch but a partition's first) go in one round trip.

    Raises:
        OffsetsMoved: a partition no longer holds the expected offset.
    """
    ordered = sorted(moves, key=lambda m: (m.topic, m.partition))
    for move in ordered:
        if move.expected is None and _first(conn, group_id, move) != 1:
            raise OffsetsMoved(group_id, move)
    later = [m for m in ordered if m.expected is not None]
    if not later:
        return
    params = [
        {
            "b_group": group_id,
            "b_topic": m.topic,
            "b_partition": m.partition,
            "b_expected": m.expected,
            "b_next": m.next_offset,
            "b_epochs": _json(m.lease_epochs),
        }
        for m in later
    ]
    if conn.execute(_LATER, params).rowcount != len(later):
        raise OffsetsMoved(group_id, _moved(conn, group_id, later))


def _first(conn: Connection, group_id: str, move: OffsetMove) -> int:
    # A concurrent first insert makes this one do nothing (rowcount 0) once the other
    # commits: that is the compare-and-set failing, as intended.
    c = consumer_offsets.c
    first = (
        pg.insert(consumer_offsets)
        .values(
            group_id=group_id,
            topic=move.topic,
            partition=move.partition,
            next_offset=move.next_offset,
            lease_epochs=_json(move.lease_epochs),
        )
        .on_conflict_do_nothing()
        .returning(c.partition)
    )
    return len(conn.execute(first).all())


_LATER = (
    update(consumer_offsets)
    .where(
        consumer_offsets.c.group_id == bindparam("b_group"),
        consumer_offsets.c.topic == bindparam("b_topic"),
        consumer_offsets.c.partition == bindparam("b_partition"),
        consumer_offsets.c.next_offset == bindparam("b_expected"),
    )
    .values(
        next_offset=bindparam("b_next"),
        lease_epochs=bindparam("b_epochs"),
        updated_at=func.now(),
    )
)
"""One partition's compare-and-set, executed for many partitions in one round trip."""


def _moved(conn: Connection, group_id: str, moves: Sequence[OffsetMove]) -> OffsetMove:
    """The move whose partition another consumer advanced (the others now hold their
    new offsets)."""
    stored = load_offsets(
        conn, group_id=group_id, partitions=[(m.topic, m.partition) for m in moves]
    )
    for move in moves:
        if stored[(move.topic, move.partition)] != move.next_offset:
            return move
    return moves[0]


def _json(epochs: Mapping[int, int]) -> dict[str, int]:
    return {str(shard): epoch for shard, epoch in sorted(epochs.items())}
