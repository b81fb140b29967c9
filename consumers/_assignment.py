"""What a consumer holds: its partitions, the stored offset and epoch fence of each, and
which of them must be rewound before anything more of theirs is applied.

The offsets Kafka would keep live in the database (see :mod:`._offsets`); this is the
consumer's copy of them, brought back in step with the database on every assignment and
after every failed batch, and advanced only by a batch that committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial

from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as KafkaPartition

from agent_blackbox.broker import EpochFence, GrantedEpochs, kafka_errors
from agent_blackbox.consumers._errors import ConsumerError
from agent_blackbox.consumers._offsets import OffsetMove, TopicPartition, load_fences, load_offsets
from agent_blackbox.consumers._view_database import ViewDatabase
from agent_blackbox.outbox.lifecycle import lease_epochs

# These are the runtime's log lines: they keep its logger's name.
log = logging.getLogger("agent_blackbox.consumers._runtime")


class Assignment:
    """The partitions one consumer holds and where each stands in the database.

    Args:
        database: where the group's offsets and fences are stored.
        group_id: the consumer group whose offsets they are.
        consumer: the consumer's name, for the log.
    """

    def __init__(self, database: ViewDatabase, *, group_id: str, consumer: str) -> None:
        self._database = database
        self._group_id = group_id
        self._consumer = consumer
        self.positions: dict[TopicPartition, int | None] = {}
        """The stored next offset of each partition held (``None``: nothing stored)."""
        self.unsynced: set[TopicPartition] = set()
        """Partitions whose Kafka position may not be the stored one: nothing of theirs
        is applied until :meth:`rewind` has read the database again."""
        self.fence = EpochFence(GrantedEpochs(partial(lease_epochs, database.engine)))
        """Judges stale relay copies (moved only to epochs the write side granted);
        stored beside the offsets."""
        self.rebalances = 0
        """Rebalances seen (each assignment and revocation counts)."""

    @property
    def held(self) -> list[TopicPartition]:
        """The partitions held now, sorted."""
        return sorted(self.positions)

    def assign(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        """Take ``partitions`` (a rebalance callback): each starts at its stored offset."""
        self.rebalances += 1
        tps = [(p.topic, p.partition) for p in partitions]
        self.fence.forget(p for _, p in tps)
        try:
            stored = self._load(tps)
        except ConsumerError as exc:
            # Assign anyway (the client would otherwise assign at Kafka's offsets) and
            # apply nothing from these partitions until a rewind has read the database.
            log.warning("consumer %s: cannot read offsets on assignment: %s", self._consumer, exc)
            self.positions.update(dict.fromkeys(tps))
            self.unsynced.update(tps)
            consumer.assign(partitions)
            return
        self.positions.update(stored)
        consumer.assign([_kafka_partition(tp, offset) for tp, offset in stored.items()])
        log.info("consumer %s assigned %s", self._consumer, _describe(stored))

    def revoke(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        """Give ``partitions`` up (a rebalance callback)."""
        self.rebalances += 1
        for p in partitions:
            self.positions.pop((p.topic, p.partition), None)
            self.unsynced.discard((p.topic, p.partition))
        self.fence.forget(p.partition for p in partitions)
        consumer.unassign()
        given_up = [f"{p.topic}[{p.partition}]" for p in partitions]
        log.info("consumer %s gave up %s", self._consumer, ", ".join(given_up) or "nothing")

    def drop_all(self) -> None:
        """Hold nothing: the client that held the partitions is gone (fenced), and the
        next one is assigned afresh."""
        self.fence.forget(p for _, p in self.positions)
        self.positions.clear()
        self.unsynced.clear()

    def rewind(self, consumer: Consumer) -> None:
        """Seek every partition held to its stored offset, and reset its fence.

        Raises:
            ViewStoreUnavailable: the database could not be read.
            KafkaUnavailable: the client could not seek.
        """
        stored = self._load(list(self.positions))
        for tp, offset in stored.items():
            rewind = f"consumer {self._consumer!r} could not rewind {tp[0]}[{tp[1]}]"
            with kafka_errors(rewind, hint="restart it"):
                consumer.seek(_kafka_partition(tp, offset))
        self.positions.update(stored)
        self.unsynced.clear()
        log.info("consumer %s rewound to %s", self._consumer, _describe(stored))

    def lose_track(self) -> None:
        """A batch failed: the client's position is past what was committed."""
        self.unsynced.update(self.positions)

    def floors(self) -> dict[TopicPartition, int]:
        """The lowest offset of each partition whose messages are ours to apply.

        Messages of revoked partitions, of partitions awaiting a rewind, or below the
        stored offset (fetched before a seek took effect) are not.
        """
        unsynced = self.unsynced
        return {tp: stored or 0 for tp, stored in self.positions.items() if tp not in unsynced}

    def moves(self, next_offsets: Mapping[TopicPartition, int]) -> list[OffsetMove]:
        """The compare-and-set advances to ``next_offsets``, each from the stored
        position, with the fence as it stands now."""
        return [
            OffsetMove(tp[0], tp[1], self.positions[tp], next_offset, self.fence.state(tp[1]))
            for tp, next_offset in next_offsets.items()
        ]

    def advance(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        """A batch committed: the database now stores ``next_offsets`` (of the
        partitions still held: a batch may commit after its client was fenced and
        dropped, and the next assignment reads the stored offsets anyway)."""
        positions = self.positions
        for tp, offset in next_offsets.items():
            if tp in positions:
                positions[tp] = offset

    def _load(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The stored offsets of ``tps``; their fences are reset to the stored ones
        (what a rolled-back batch admitted is forgotten with it)."""
        with self._database.transaction() as conn:
            offsets = load_offsets(conn, group_id=self._group_id, partitions=tps)
            fences = load_fences(conn, group_id=self._group_id, partitions=tps)
        for (_, partition), epochs in fences.items():
            self.fence.forget([partition])
            self.fence.restore(partition, epochs)
        return offsets


def _kafka_partition(tp: TopicPartition, offset: int | None) -> KafkaPartition:
    return KafkaPartition(tp[0], tp[1], OFFSET_BEGINNING if offset is None else offset)


def _describe(stored: dict[TopicPartition, int | None]) -> str:
    parts = [f"{t}[{p}]@{'start' if o is None else o}" for (t, p), o in sorted(stored.items())]
    return ", ".join(parts) or "nothing"
