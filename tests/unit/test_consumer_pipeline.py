"""The consumer runtime's pipeline (a batch commits while the next is decoded), without
services: the Kafka reads and the database commit are replaced by scripted ones."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from agent_blackbox.consumers import BatchOutcome, ConsumerRuntime, ViewStoreUnavailable
from agent_blackbox.consumers._offsets import OffsetMove
from agent_blackbox.consumers._pipeline import Pipeline
from agent_blackbox.consumers._sorting import Batch
from agent_blackbox.schemas import Settings
from tests.unit.test_consumer_fence import TOPIC, FakeMessage

Reads = list[list[FakeMessage]]


class Scripted(ConsumerRuntime):
    """Reads ``reads`` one list per poll; commits by recording the moves, or fails
    on the batches named in ``fail_at`` (by the first offset they hold)."""

    def __init__(self, reads: Reads, *, fail_at: Sequence[int] = ()) -> None:
        super().__init__(
            Settings(topic=TOPIC),
            lambda _conn, _records: BatchOutcome(),
            name="pipeline-test",
            registry=CollectorRegistry(),
        )
        self._assignment.positions = {(TOPIC, 0): 0}
        self.reads = reads
        self.fail_at = set(fail_at)
        self.commits: list[list[OffsetMove]] = []
        self.rewinds = 0
        self.on_read: dict[int, object] = {}

    def _receive(self, timeout: float) -> list[FakeMessage]:  # type: ignore[override]
        if self._assignment.unsynced:
            self._sync()
        turn = len(self.reads)
        hook = self.on_read.pop(turn, None)
        if callable(hook):
            hook()
        return self.reads.pop(0) if self.reads else []

    def _commit(self, batch: Batch, moves: Sequence[OffsetMove]) -> BatchOutcome:
        first = min(p.offset for p in batch.poison)
        if first in self.fail_at:
            self.fail_at.discard(first)
            raise ViewStoreUnavailable("the database went away")
        self.commits.append(list(moves))
        return BatchOutcome(dead_lettered=len(batch.poison))

    def _sync(self) -> None:
        self.rewinds += 1
        self._assignment.unsynced.clear()


def _messages(*offsets: int) -> list[FakeMessage]:
    return [FakeMessage(0, offset, None) for offset in offsets]


def _moved(runtime: Scripted) -> list[tuple[int | None, int]]:
    return [(m.expected, m.next_offset) for moves in runtime.commits for m in moves]


def test_batches_commit_in_order_each_from_where_the_last_left_off() -> None:
    runtime = Scripted([_messages(0, 1), _messages(2), _messages(3, 4)])
    with Pipeline(runtime) as pipeline:
        outcomes = [pipeline.turn(0) for _ in range(4)]
        assert pipeline.flush() is None

    assert _moved(runtime) == [(0, 2), (2, 3), (3, 5)]
    assert [o.dead_lettered if o else None for o in outcomes] == [None, 2, 1, 2]
    assert runtime._assignment.positions == {(TOPIC, 0): 5}


def test_the_batch_left_waiting_is_committed_by_flush() -> None:
    runtime = Scripted([_messages(0, 1)])
    with Pipeline(runtime) as pipeline:
        assert pipeline.turn(0) is None
        assert pipeline.holding
        outcome = pipeline.flush()

    assert outcome is not None
    assert outcome.dead_lettered == 2
    assert _moved(runtime) == [(0, 2)]


def test_a_failed_commit_drops_the_batch_decoded_behind_it() -> None:
    runtime = Scripted([_messages(0, 1), _messages(2, 3), _messages(4)], fail_at=[0])
    with Pipeline(runtime) as pipeline:
        assert pipeline.turn(0) is None
        with pytest.raises(ViewStoreUnavailable):
            pipeline.turn(0)  # commits 0-1 (fails) while 2-3 is decoded
        assert not pipeline.holding
        assert runtime._assignment.positions == {(TOPIC, 0): 0}
        assert runtime._assignment.unsynced
        pipeline.turn(0)  # rewinds first, then reads on

    assert runtime.rewinds == 1
    assert runtime.commits == []  # 2-3 was never applied out of order


def test_a_batch_read_before_a_rebalance_is_not_applied() -> None:
    runtime = Scripted([_messages(0, 1), _messages(2)])

    def rebalance() -> None:
        runtime._assignment.rebalances += 1

    runtime.on_read[1] = rebalance  # during the poll that would hand 0-1 to the worker
    with Pipeline(runtime) as pipeline:
        pipeline.turn(0)
        assert pipeline.turn(0) is None
        pipeline.flush()

    assert _moved(runtime) == [(0, 3)]  # 2 alone, from the stored position


def test_the_switch_interval_is_restored_when_the_last_pipeline_stops() -> None:
    before = sys.getswitchinterval()
    first, second = Pipeline(Scripted([])), Pipeline(Scripted([]))
    first.__enter__()
    second.__enter__()
    assert sys.getswitchinterval() <= 0.001
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() <= 0.001  # the second still runs
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
