"""Assembling runs from a partition's messages: hand-off at run.finished, first copy of
each sequence, the epoch fence, and every kind of poison passed over and reported."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from agent_blackbox.broker import EpochFence, KafkaUnavailable, LeaseStamp, partition_of
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import _history as history
from agent_blackbox.replayer._history import (
    AssembledRun,
    Handled,
    HistoryScan,
    LateEvents,
    PartitionFailed,
    SkippedMessage,
    _default_workers,
    _lost_workers,
    assemble,
    largest_first,
)
from agent_blackbox.schemas import Envelope, EnvelopeCodec, EventType, Settings

CODEC = EnvelopeCodec()
PARTITION = 3


@dataclass
class FakeMessage:
    """What the reader asks of a broker message."""

    _key: bytes | None
    _value: bytes | None
    _offset: int
    _headers: list[tuple[str, bytes | str | None]] | None = None
    _partition: int = PARTITION

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return self._partition

    def headers(self) -> list[tuple[str, bytes | str | None]] | None:
        return self._headers


def _agent(run: AgentRun, input: Any) -> Any:
    return sum(run.random() for _ in range(int(input["steps"])))


def record(steps: int = 3) -> list[Envelope]:
    """A real run of ``steps`` + 2 events."""
    events: list[Envelope] = []
    snapshot = RunSnapshot(code_version="t", input={"steps": steps})
    MemoryRecorder(sink=events.append).record(_agent, snapshot, agent_id="a")
    return events


def messages(
    *items: tuple[bytes | None, bytes | None] | Envelope, epoch: int | None = None
) -> list[FakeMessage]:
    out = []
    for offset, item in enumerate(items):
        if isinstance(item, Envelope):
            key, value = item.run_id.encode(), CODEC.encode(item)
        else:
            key, value = item
        headers = None if epoch is None else [LeaseStamp(0, epoch).header()]
        out.append(FakeMessage(key, value, offset, headers))
    return out


def run_all(msgs: list[FakeMessage], **kw: Any) -> list[AssembledRun | SkippedMessage | LateEvents]:
    return list(assemble(msgs, PARTITION, fence=kw.pop("fence", EpochFence()), **kw))  # type: ignore[arg-type]


def test_interleaved_runs_are_handed_off_at_run_finished_unfinished_ones_at_the_end() -> None:
    a, b, c = record(3), record(2), record(4)
    unfinished = c[:-1]
    order = [a[0], b[0], unfinished[0], a[1], b[1], b[2], b[3], a[2], a[3], unfinished[1], a[4]]
    order += unfinished[2:]
    found = run_all(messages(*order))
    assert all(isinstance(r, AssembledRun) for r in found)
    runs = [r for r in found if isinstance(r, AssembledRun)]
    assert [r.run_id for r in runs] == [b[0].run_id, a[0].run_id, c[0].run_id]
    assert [r.finished for r in runs] == [True, True, False]
    assert runs[0].events == b
    assert runs[1].events == a
    assert runs[2].events == unfinished
    assert runs[1].agent_id == "a"
    assert runs[1].partition == PARTITION


def test_the_first_copy_of_each_sequence_counts() -> None:
    a = record(3)
    copy = replace(a[2], attributes={"copy": "second"})
    found = run_all(messages(a[0], a[1], a[2], a[1], copy, a[3], a[4], a[4]))
    [run] = found
    assert isinstance(run, AssembledRun)
    assert run.events == a


def test_a_stale_relays_copy_is_never_used() -> None:
    a = record(3)
    stale = replace(a[2], attributes={"from": "stale relay"})
    msgs = messages(a[0], a[1], epoch=2)
    # The relay that lost the shard delivers its queued copy of sequence 3 after the new
    # owner (epoch 2) published: without the fence it would be the first copy.
    msgs += [
        FakeMessage(stale.run_id.encode(), CODEC.encode(stale), 2, [LeaseStamp(0, 1).header()])
    ]
    msgs += [replace(m, _offset=m._offset + 3) for m in messages(a[2], a[3], a[4], epoch=2)]
    fence = EpochFence()
    [run] = run_all(msgs, fence=fence)
    assert isinstance(run, AssembledRun)
    assert run.events == a
    assert fence.dropped == 1


def test_every_kind_of_poison_is_skipped_and_reported_and_the_run_still_read() -> None:
    a = record(3)
    key = a[0].run_id.encode()
    good = CODEC.encode(a[1])
    other_run = record(1)[0]
    poison: list[tuple[bytes | None, bytes | None]] = [
        (key, b"\x7f" + os.urandom(40)),  # random bytes
        (key, b"\xc3\x01" + b"\x00" * 8 + good[10:]),  # a fingerprint no schema has
        (key, b""),  # an empty value
        (key, None),  # a tombstone
        (key, good[: len(good) // 2]),  # truncated Avro
        (key, b"\x00" + struct.pack(">I", 99) + good[10:]),  # a schema id (no registry)
        (key, CODEC.encode(other_run)),  # another run's envelope under this key
    ]
    found = run_all(messages(a[0], *poison, a[1], a[2], a[3], a[4]))
    skipped = [s for s in found if isinstance(s, SkippedMessage)]
    runs = [r for r in found if isinstance(r, AssembledRun)]
    assert [r.events for r in runs] == [a]
    assert [(s.partition, s.offset, s.key) for s in skipped] == [
        (PARTITION, offset, a[0].run_id) for offset in range(1, 8)
    ]
    reasons = [s.reason for s in skipped]
    assert "not an envelope" in reasons[0]
    assert "unknown writer schema fingerprint" in reasons[1]
    assert reasons[2] == reasons[3] == "empty value: not an envelope"
    assert "not valid Avro" in reasons[4]
    assert "no schema registry is configured" in reasons[5]
    assert f"an envelope of run {other_run.run_id!r}" in reasons[6]
    assert "[3]@1 under key" in skipped[0].describe()


def test_poison_without_a_key_or_under_an_unwanted_run_is_still_reported() -> None:
    a, b = record(1), record(1)
    found = run_all(messages((None, b"junk"), *b, *a), wanted={a[0].run_id})
    assert [type(item) for item in found] == [SkippedMessage, AssembledRun]
    assert found[0].key is None  # type: ignore[union-attr]
    assert found[1].run_id == a[0].run_id  # type: ignore[union-attr]


def test_events_after_run_finished_make_the_run_late() -> None:
    a = record(1)
    redacted = replace(a[-1], sequence=len(a) + 1, event_type=EventType.RUN_REDACTED)
    found = run_all(messages(*a, a[-1], redacted))
    assert isinstance(found[0], AssembledRun)
    assert found[0].events == a
    assert found[1:] == [LateEvents(a[0].run_id, PARTITION)]


def test_readers_take_the_largest_partitions_first_so_they_finish_together() -> None:
    ranges = {0: (0, 100), 1: (0, 10), 2: (5, 95), 3: (0, 20), 4: (0, 10)}
    assert [p for p, _ in largest_first(ranges)] == [0, 2, 3, 1, 4]
    assert largest_first(ranges)[0] == (0, (0, 100))


def test_a_short_history_is_read_in_process_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert [_default_workers(n) for n in (0, 19_999, 40_000, 10**6)] == [1, 1, 2, 4]


def test_many_short_runs_are_worth_a_worker_sooner_than_their_messages_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    # 2,000 runs of 11 events: 22,000 messages alone would give one reader.
    assert _default_workers(22_000) == 1
    assert [_default_workers(22_000, n) for n in (999, 2_000, 3_000, 10**5)] == [1, 2, 3, 4]


def test_a_run_is_read_only_in_the_partition_its_key_maps_to() -> None:
    runs = [record(1) for _ in range(12)]
    home = [r for r in runs if partition_of(r[0].run_id.encode(), 12) == PARTITION]
    away = [r for r in runs if partition_of(r[0].run_id.encode(), 12) != PARTITION]
    assert away  # twelve random run ids do not all map to one partition of twelve
    msgs = messages(*(e for r in runs for e in r))
    found = run_all(msgs, partitions=12)
    assembled = [r.run_id for r in found if isinstance(r, AssembledRun)]
    assert assembled == [r[0].run_id for r in home]
    skipped = [s for s in found if isinstance(s, SkippedMessage)]
    assert len(skipped) == sum(len(r) for r in away)
    assert "whose key maps to partition" in skipped[0].reason


@dataclass
class Collecting:
    """A handler that says what it was given."""

    def start(self) -> Collecting:
        return self

    def handle(self, run: AssembledRun) -> str:
        return f"handled {len(run.events)} finished={run.finished}"

    def missing(self, run_id: str, why: str, *, unread: bool) -> str:
        return f"missing unread={unread}"

    def late(self, run_id: str) -> str | None:
        return None

    def close(self) -> None:
        self.closed = True


def test_a_scan_hands_back_every_run_and_names_the_ones_it_could_not_find(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = record(1), record(2)
    while _home(b) == _home(a):
        b = record(2)
    held: dict[int, list[FakeMessage]] = {0: [], 1: [], 2: []}
    held[_home(a)] = messages(*a, (b"x", b"junk"))
    held[_home(b)] = messages(*b[:-1])

    def read(settings: Any, topic: str, ranges: Any, **_: Any) -> Iterator[FakeMessage]:
        [(partition, (low, high))] = ranges.items()
        for message in held[partition][low:high]:
            yield replace(message, _partition=partition)
        if partition == _home(b) and broken:
            raise KafkaUnavailable("the broker went away")

    marks = {p: (0, len(m)) for p, m in held.items()}
    monkeypatch.setattr(history, "watermarks", lambda *_, **__: marks)
    monkeypatch.setattr(history, "read_ranges", read)
    settings = Settings()
    wanted = frozenset({a[0].run_id, b[0].run_id, "gone"})

    broken = False
    work = Collecting()
    scan = HistoryScan(settings, work, wanted=wanted, workers=1)
    found = list(scan)
    assert getattr(work, "closed", False)  # its connections are released
    results = {h.run_id: h.result for h in found if isinstance(h, Handled)}
    assert results == {
        a[0].run_id: "handled 3 finished=True",
        b[0].run_id: "handled 3 finished=False",
        "gone": "missing unread=False",
    }
    assert [(s.partition, s.offset, s.key) for s in scan.skipped] == [(_home(a), 3, "x")]
    assert (scan.total, scan.messages, scan.partitions, scan.failed) == (7, 7, 3, [])

    # Work that cannot be sent to a worker process is done in this one.
    unpicklable = Collecting()
    unpicklable.note = lambda: None  # type: ignore[attr-defined]
    scan = HistoryScan(settings, unpicklable, wanted=wanted, workers=2)
    assert {h.run_id: h.result for h in scan if isinstance(h, Handled)} == results

    broken = True
    scan = HistoryScan(settings, Collecting(), wanted=wanted, workers=1)
    results = {h.run_id: h.result for h in scan if isinstance(h, Handled)}
    assert results[b[0].run_id] == results["gone"] == "missing unread=True"
    assert scan.failed == [PartitionFailed(_home(b), "the broker went away")]


def _home(run: list[Envelope]) -> int:
    return partition_of(run[0].run_id.encode(), 3)


def test_a_killed_worker_fails_its_partitions() -> None:
    @dataclass
    class Exited:
        exitcode: int | None

    plan = [(0, (0, 5)), (3, (0, 2))]
    watched: list[tuple[Any, Any]] = [(Exited(None), plan), (Exited(0), plan), (Exited(-9), plan)]
    lost = list(_lost_workers(watched))
    assert lost == [
        [
            PartitionFailed(0, "worker exited with status -9"),
            PartitionFailed(3, "worker exited with status -9"),
        ]
    ]
    assert [w.exitcode for w, _ in watched] == [None, 0]
