"""Group commit mode (issue 12, item 8) on the memory recorders: what is buffered, when
it is written, that the record is the one per-event mode makes, and what a failed flush
tells the agent."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine

from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    TicketAgent,
    replay_entry,
    sample_tickets,
)
from agent_blackbox.outbox import (
    AsyncMemoryRecorder,
    DatabaseUnavailable,
    EventsNotRecorded,
    GroupCommit,
    MemoryRecorder,
    Recorder,
    RunSnapshot,
)
from agent_blackbox.outbox._group import Batch
from agent_blackbox.outbox._memory import MemoryLog
from agent_blackbox.outbox._recorder import Run
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import GENESIS_CHAIN_HASH

SNAPSHOT = RunSnapshot(code_version="group/1")
SLOW = GroupCommit(max_delay_ms=60_000, max_events=1_000)
"""Flushes only at the points the mode defines: the timer never fires during a test."""


def _types(recorder: MemoryRecorder | AsyncMemoryRecorder) -> list[str]:
    return [str(e.event_type) for e in recorder.events]


def _eventually(condition: Callable[[], bool], *, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.005)


def test_a_group_run_records_what_a_per_event_run_records_and_replays() -> None:
    recorded = {}
    for mode, group in (("per-event", None), ("group", GroupCommit(max_events=3))):
        recorder = MemoryRecorder(group_commit=group)
        agent = TicketAgent(sample_tickets(1), KeywordModel(), Notifier())
        snapshot = agent.snapshot("T-00000")
        run, _ = recorder.record(agent.run, snapshot, agent_id="ticket-agent", run_id="run-1")
        assert [e.sequence for e in recorder.events] == list(range(1, run.last_sequence + 1))
        report = replay_run(recorder.events, replay_entry)
        assert report.passed, report.divergence and report.divergence.describe()
        recorded[mode] = [(e.sequence, e.event_type) for e in recorder.events]
    assert recorded["group"] == recorded["per-event"]


def test_non_effects_wait_for_the_next_effect_which_commits_after_them() -> None:
    recorder = MemoryRecorder(group_commit=SLOW)
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    run.now()
    run.random()
    run.call("echo", lambda x: x, 1)
    assert _types(recorder) == ["run.started"]  # buffered
    run.effect("mail", lambda key: None, arguments={"to": "x"})
    assert _types(recorder) == [
        "run.started",
        "clock.read",
        "random.draw",
        "tool.call",
        "effect.intent",
        "effect.receipt",
    ]
    run.uuid()
    run.transition("done", state={"ok": True})
    run.monotonic()
    run.finish()
    assert _types(recorder)[6:] == ["random.draw", "state.transition", "clock.read", "run.finished"]
    assert [e.sequence for e in recorder.events] == list(range(1, 11))


def test_a_full_buffer_is_written_behind_the_run_from_the_next_crossing() -> None:
    recorder = MemoryRecorder(group_commit=GroupCommit(max_delay_ms=60_000, max_events=3))
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    for _ in range(3):
        run.now()
    assert len(recorder.events) == 1
    run.now()  # the buffer held three: handed to the writer thread, the fourth is kept
    _eventually(lambda: len(recorder.events) == 4)
    run.flush()
    assert len(recorder.events) == 5


def test_the_timer_writes_a_waiting_buffer_without_another_boundary() -> None:
    recorder = MemoryRecorder(group_commit=GroupCommit(max_delay_ms=20, max_events=1_000))
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    run.now()
    _eventually(lambda: len(recorder.events) == 2)
    run.finish()


def test_the_async_timer_writes_a_waiting_buffer() -> None:
    async def scenario() -> list[str]:
        recorder = AsyncMemoryRecorder(group_commit=GroupCommit(max_delay_ms=20))
        run = await recorder.start_run(SNAPSHOT, agent_id="a")
        await run.now()
        await run.random()
        assert len(recorder.events) == 1
        deadline = time.monotonic() + 5
        while len(recorder.events) < 3:
            assert time.monotonic() < deadline, "the timer did not flush"
            await asyncio.sleep(0.005)
        await run.effect("mail", lambda key: None, arguments={})
        await run.finish()
        return _types(recorder)

    types = asyncio.run(scenario())
    assert types == [
        "run.started",
        "clock.read",
        "random.draw",
        "effect.intent",
        "effect.receipt",
        "run.finished",
    ]


class FailingFlushes:
    """Makes the next ``left`` flushes of a memory log fail as a lost database would."""

    def __init__(self, log: MemoryLog, left: int) -> None:
        self.left = left
        self._real = log.flush
        log.flush = self._flush  # type: ignore[method-assign]

    def _flush(self, core: Any, batch: Batch) -> None:
        if self.left > 0:
            self.left -= 1
            raise DatabaseUnavailable("the outbox write failed; nothing was recorded")
        self._real(core, batch)


def test_a_failed_flush_names_what_is_not_recorded_and_keeps_it_for_the_next() -> None:
    recorder = MemoryRecorder(group_commit=SLOW)
    FailingFlushes(recorder.log, left=1)
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    run.now()
    run.now()
    performed: list[str] = []
    with pytest.raises(EventsNotRecorded, match="2 buffered event") as raised:
        run.effect("mail", performed.append, arguments={})
    assert raised.value.count == 2
    assert isinstance(raised.value.cause, DatabaseUnavailable)
    assert performed == []  # no intent, so no effect, behind unrecorded events
    run.effect("mail", performed.append, arguments={})
    assert len(performed) == 1
    assert _types(recorder) == [
        "run.started",
        "clock.read",
        "clock.read",
        "effect.intent",
        "effect.receipt",
    ]


def test_a_failed_timer_flush_is_raised_at_the_next_boundary() -> None:
    recorder = MemoryRecorder(group_commit=GroupCommit(max_delay_ms=10))
    failing = FailingFlushes(recorder.log, left=1)
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    run.now()
    _eventually(lambda: failing.left == 0)
    _eventually(lambda: run.core.unreported is not None)
    called: list[int] = []
    with pytest.raises(EventsNotRecorded, match="1 buffered event"):
        run.call("tool", called.append, 1)
    assert called == []  # raised before the tool ran
    run.finish()  # the buffer is written first
    assert _types(recorder) == ["run.started", "clock.read", "run.finished"]


def test_the_mode_is_read_from_the_environment() -> None:
    assert GroupCommit.from_env({}) is None
    assert GroupCommit.from_env({"BLACKBOX_GROUP_COMMIT": "off"}) is None
    assert GroupCommit.from_env({"BLACKBOX_GROUP_COMMIT": "on"}) == GroupCommit()
    chosen = GroupCommit.from_env(
        {
            "BLACKBOX_GROUP_COMMIT": "on",
            "BLACKBOX_GROUP_COMMIT_MS": "5",
            "BLACKBOX_GROUP_COMMIT_EVENTS": "10",
        }
    )
    assert chosen == GroupCommit(max_delay_ms=5, max_events=10)
    with pytest.raises(ValueError, match="BLACKBOX_GROUP_COMMIT='maybe'"):
        GroupCommit.from_env({"BLACKBOX_GROUP_COMMIT": "maybe"})
    with pytest.raises(ValueError, match="BLACKBOX_GROUP_COMMIT_EVENTS='many'"):
        GroupCommit.from_env(
            {"BLACKBOX_GROUP_COMMIT": "on", "BLACKBOX_GROUP_COMMIT_EVENTS": "many"}
        )
    with pytest.raises(ValueError, match="max_events must be an integer > 0"):
        GroupCommit(max_events=0)
    with pytest.raises(ValueError, match="max_delay_ms must be > 0"):
        GroupCommit(max_delay_ms=0)


def test_a_recorder_without_the_keyword_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BLACKBOX_GROUP_COMMIT", "on")
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connects
    assert Recorder(engine).group_commit == GroupCommit()
    assert Recorder(engine, group_commit=None).group_commit is None
    assert MemoryRecorder().group_commit is None  # a test's recorder: not from the environment


def test_a_failed_timer_flush_is_not_reported_once_its_events_are_written() -> None:
    recorder = MemoryRecorder(group_commit=GroupCommit(max_delay_ms=10))
    failing = FailingFlushes(recorder.log, left=1)
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    run.now()
    _eventually(lambda: failing.left == 0 and run.core.unreported is not None)
    run.flush()  # written after all
    assert run.call("tool", lambda x: x, 1) == 1  # nothing left to report
    run.finish()
    assert _types(recorder) == ["run.started", "clock.read", "tool.call", "run.finished"]


def test_agent_code_that_flushes_replays_unchanged() -> None:
    def agent(run: Any, _input: Any) -> float:
        value = run.random()
        run.flush()
        return float(value)

    async def async_agent(run: Any, _input: Any) -> float:
        value = await run.random()
        await run.flush()
        return float(value)

    recorder = MemoryRecorder(group_commit=SLOW)
    recorder.record(agent, SNAPSHOT, agent_id="a", run_id="run-1")
    assert replay_run(recorder.events, agent).passed
    assert replay_run(recorder.events, async_agent).passed


class GatedFlushes:
    """Holds each flush of a memory log until the test opens the gate, and fails the first
    ``fail`` of them (after the gate) as a lost database would; says when a flush is held."""

    def __init__(self, log: MemoryLog, *, fail: int = 0, moved: int = 0) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fail = fail
        self.moved = moved
        self.flushed: list[list[int]] = []
        self._real = log.flush
        log.flush = self._flush  # type: ignore[method-assign]

    def _flush(self, core: Any, batch: Batch) -> None:
        self.entered.set()
        assert self.gate.wait(5), "the test never opened the gate"
        if self.fail > 0:
            self.fail -= 1
            raise DatabaseUnavailable("the outbox write failed; nothing was recorded")
        if self.moved > 0 and batch.behind:  # as the Postgres log finds a run that moved
            self.moved -= 1
            batch.moved = True
            return
        self.flushed.append([entry.event.envelope.sequence for entry in batch.entries])
        self._real(core, batch)


def _chained(recorder: MemoryRecorder) -> None:
    """The recorded events are contiguous from 1 and their chain holds."""
    events = recorder.events
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    previous = GENESIS_CHAIN_HASH
    for event in events:
        assert event.chain_hash == event.expected_chain_hash(previous)
        previous = event.chain_hash


FOUR = GroupCommit(max_delay_ms=60_000, max_events=3)
"""Hands a batch to the writer thread at the fourth buffered event; no timer."""


def _batch_in_flight(**gated: int) -> tuple[MemoryRecorder, GatedFlushes, Run]:
    """A run whose first batch (2, 3, 4) is held in its writer thread's flush; the fourth
    clock read (5) is buffered behind it."""
    recorder = MemoryRecorder(group_commit=FOUR)
    flushes = GatedFlushes(recorder.log, **gated)
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    for _ in range(4):
        run.now()
    assert flushes.entered.wait(5)
    return recorder, flushes, run


def test_the_run_buffers_behind_a_batch_in_flight() -> None:
    # 2, 3 and 4 handed off at the fourth clock read, which is kept as 5.
    recorder, gated, run = _batch_in_flight()
    run.random()  # 6, buffered while 2-4 are in flight
    assert run.last_sequence == 6
    gated.gate.set()
    run.finish()
    assert gated.flushed == [[2, 3, 4], [5, 6]]
    assert _types(recorder)[4:] == ["clock.read", "random.draw", "run.finished"]
    _chained(recorder)


def test_a_batch_that_fails_in_flight_comes_back_ahead_of_the_buffer() -> None:
    recorder, gated, run = _batch_in_flight(fail=1)
    run.random()  # buffered behind the batch that is going to fail
    gated.gate.set()
    _eventually(lambda: run.core.unreported is not None)
    called: list[int] = []
    with pytest.raises(EventsNotRecorded, match="5 buffered event") as raised:
        run.call("tool", called.append, 1)
    assert isinstance(raised.value.cause, DatabaseUnavailable)
    assert called == []  # raised at the boundary, before its tool ran
    assert run.last_sequence == 6  # nothing prepared again: sequences and chain stay
    run.flush()
    assert gated.flushed == [[2, 3, 4, 5, 6]]  # in order, the failed batch first
    run.finish()
    assert _types(recorder) == ["run.started"] + ["clock.read"] * 4 + [
        "random.draw",
        "run.finished",
    ]
    _chained(recorder)


def test_a_full_buffer_behind_a_failed_batch_raises_at_the_crossing_that_fills_it() -> None:
    recorder, gated, run = _batch_in_flight(fail=1)
    run.now()
    run.now()  # 5, 6, 7 buffered: full again while 2-4 are in flight
    gated.gate.set()
    with pytest.raises(EventsNotRecorded, match="6 buffered event"):
        run.now()  # waits for the batch in flight, which failed: at most 2 x 3 kept
    assert run.last_sequence == 7
    run.finish()
    assert gated.flushed == [[2, 3, 4, 5, 6, 7]]
    _chained(recorder)


@pytest.mark.parametrize("boundary", ["effect", "transition", "flush", "finish"])
def test_what_is_never_buffered_waits_for_the_batch_in_flight(boundary: str) -> None:
    recorder, gated, run = _batch_in_flight()
    waiting = threading.Event()
    settle = run._settle

    def settling(buffer: Any) -> None:
        if buffer.in_flight is not None:
            waiting.set()  # the boundary waits for the batch: now let it be written
        settle(buffer)

    run._settle = settling  # type: ignore[method-assign]

    def open_when_waiting() -> None:
        if waiting.wait(5):
            gated.gate.set()

    opener = threading.Thread(target=open_when_waiting)
    opener.start()
    seen: list[int] = []
    if boundary == "effect":
        run.effect("mail", lambda key: seen.append(len(recorder.events)), arguments={})
        assert seen == [6]  # started, the batch of three, the fourth read, the intent
    elif boundary == "transition":
        run.transition("done", state={})
    elif boundary == "flush":
        run.flush()
    else:
        run.finish()
    opener.join()
    assert gated.flushed == [[2, 3, 4], [5]]
    _chained(recorder)


def test_a_batch_that_comes_back_moved_is_written_by_the_run_itself() -> None:
    recorder = MemoryRecorder(group_commit=FOUR)
    gated = GatedFlushes(recorder.log, moved=1)
    gated.gate.set()
    run = recorder.start_run(SNAPSHOT, agent_id="a")
    for _ in range(4):
        run.now()
    _eventually(lambda: gated.moved == 0 and run._buffer is not None and len(run._buffer) == 4)
    assert run.core.unreported is None  # nothing failed: the run prepares it again
    run.random()  # the buffer is full: the run writes it, the batch that came back first
    assert gated.flushed == [[2, 3, 4, 5]]
    run.finish()
    assert gated.flushed == [[2, 3, 4, 5], [6]]
    _chained(recorder)


def test_a_boundary_whose_flush_fails_after_the_batch_in_flight_failed_reports_it_once() -> None:
    recorder, gated, run = _batch_in_flight(fail=2)
    gated.gate.set()
    performed: list[str] = []
    with pytest.raises(EventsNotRecorded, match="4 buffered event"):
        # Waits for the batch in flight (it fails, and comes back), then fails to write
        # it with the fourth read: one error for the four, and no effect.
        run.effect("mail", performed.append, arguments={})
    assert performed == []
    run.now()  # nothing stale left to report; the full buffer goes to the writer thread
    run.finish()
    assert gated.flushed == [[2, 3, 4, 5], [6]]
    _chained(recorder)
