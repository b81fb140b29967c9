"""Errors say what is known (issue 31, item 2): an append whose commit was cut says
"nothing was recorded" only when that is true.

A TCP proxy between the recorder and Postgres lets a COMMIT (or an autocommitted append)
reach the server and drops the answer; then it resets new connections (the database
looks down) for some or all of the retries. When every retry is refused, the error is
:class:`MaybeRecorded` although the event is in the outbox; when a retry gets through,
the recorder finds its event there and carries on: no error, no second row, the tool or
the effect performed once. ``test_honest_errors_crash.py`` checks the same under a real
``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.outbox import (
    AsyncRecorder,
    DatabaseUnavailable,
    EventsNotRecorded,
    GroupCommit,
    MaybeRecorded,
    Recorder,
    Run,
    RunSnapshot,
)
from agent_blackbox.schemas import Settings
from tests.integration._pgproxy import CommitDropper, dropping_commits, through

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture
def proxied(engine: Engine) -> Iterator[tuple[CommitDropper, Engine]]:
    with dropping_commits(engine) as pair:
        yield pair


def _sequences(engine: Engine, run_id: str) -> list[int]:
    """The run's outbox sequences, checking no event id was appended twice."""
    query = text("SELECT sequence, event_id::text FROM blackbox.outbox WHERE run_id = :r")
    with engine.connect() as conn:
        rows = sorted((int(s), str(e)) for s, e in conn.execute(query, {"r": run_id}))
    assert len({e for _, e in rows}) == len(rows), "an event id was appended twice"
    return [s for s, _ in rows]


def _effects(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT idempotency_key, status FROM blackbox.effects")).all()
    return [(str(key), str(status)) for key, status in rows]


def _started(writer: Engine, settings: Settings, group_commit: GroupCommit | None = None) -> Run:
    recorder = Recorder(writer, settings=settings, group_commit=group_commit)
    return recorder.start_run(RunSnapshot("errors.1"), agent_id="errors-agent")


# (a) the reply is dropped, then every reconnect is refused -------------------------------


def test_a_cut_commit_then_a_refused_reconnect_says_it_may_have_been_recorded(
    engine: Engine, proxied: tuple[CommitDropper, Engine], settings: Settings
) -> None:
    proxy, writer = proxied
    run = _started(writer, settings)
    calls: list[int] = []

    def double(n: int) -> int:
        calls.append(n)
        return n * 2

    proxy.cut(1)
    proxy.refuse(math.inf)
    with pytest.raises(MaybeRecorded, match="may have been recorded") as raised:
        run.call("double", double, 21)
    assert raised.value.maybe_recorded
    assert "nothing was recorded" not in str(raised.value)
    assert proxy.cuts == 1
    assert proxy.refused == 2  # both retries tried to reach the database
    assert _sequences(engine, run.run_id) == [1, 2]  # it was recorded
    assert (raised.value.run_id, raised.value.sequence) == (run.run_id, 2)
    with engine.connect() as conn:
        query = text("SELECT event_id::text FROM blackbox.outbox WHERE sequence = 2")
        assert raised.value.event_id == conn.execute(query).scalar_one()  # the error names it
    assert calls == [21]
    proxy.refuse(0)
    run.now()  # the run's next append continues after the event that committed
    assert _sequences(engine, run.run_id) == [1, 2, 3]


def test_a_cut_effect_intent_then_a_refused_reconnect_is_not_performed_and_stays_open(
    engine: Engine, proxied: tuple[CommitDropper, Engine], settings: Settings
) -> None:
    proxy, writer = proxied
    run = _started(writer, settings)
    performed: list[str] = []
    proxy.cut(1)
    proxy.refuse(math.inf)
    with pytest.raises(MaybeRecorded) as raised:
        run.effect("refund", performed.append, arguments={"order": "O-1"}, key="k1")
    assert performed == []  # the intent did not answer: the effect was never called
    assert any("unresolved_effects" in note for note in raised.value.__notes__)
    assert _sequences(engine, run.run_id) == [1, 2]
    assert _effects(engine) == [("k1", "pending")]
    proxy.refuse(0)
    recorder = Recorder(writer, settings=settings)
    assert [e.idempotency_key for e in recorder.unresolved_effects(run_id=run.run_id)] == ["k1"]


def test_a_cut_start_then_a_refused_reconnect_says_the_run_may_exist(
    engine: Engine, proxied: tuple[CommitDropper, Engine], settings: Settings
) -> None:
    proxy, writer = proxied
    recorder = Recorder(writer, settings=settings)
    with writer.connect():  # (the engine's first connection asks the server its version)
        pass
    proxy.cut(1)
    proxy.refuse(math.inf)
    with pytest.raises(MaybeRecorded):
        recorder.start_run(RunSnapshot("errors.1"), agent_id="errors-agent", run_id="cut-start")
    assert _sequences(engine, "cut-start") == [1]


def test_a_cut_flush_then_a_refused_reconnect_says_its_events_may_have_been_recorded(
    engine: Engine, proxied: tuple[CommitDropper, Engine], settings: Settings
) -> None:
    proxy, writer = proxied
    run = _started(writer, settings, GroupCommit(max_delay_ms=60_000))
    run.now()
    run.now()
    proxy.cut(1)
    proxy.refuse(math.inf)
    with pytest.raises(EventsNotRecorded) as raised:
        run.flush()
    assert raised.value.maybe_recorded
    assert isinstance(raised.value.cause, MaybeRecorded)
    assert _sequences(engine, run.run_id) == [1, 2, 3]
    proxy.refuse(0)
    run.flush()  # finds its batch committed: nothing written twice
    run.now()
    run.flush()
    assert _sequences(engine, run.run_id) == [1, 2, 3, 4]


def test_the_async_recorder_keeps_the_ambiguity_through_a_refused_reconnect(
    engine: Engine, proxied: tuple[CommitDropper, Engine], settings: Settings
) -> None:
    proxy, _ = proxied

    async def scenario() -> tuple[str, BaseException | None]:
        writer = create_async_engine(through(engine.url, proxy))
        try:
            recorder = AsyncRecorder(writer, settings=settings)
            run = await recorder.start_run(RunSnapshot("errors.1"), agent_id="errors-agent")
            proxy.cut(1)
            proxy.refuse(math.inf)
            try:
                await run.now()
            except DatabaseUnavailable as exc:
                return run.run_id, exc
            return run.run_id, None
        finally:
            await writer.dispose()

    run_id, error = asyncio.run(scenario())
    assert isinstance(error, MaybeRecorded), error
    assert _sequences(engine, run_id) == [1, 2]


def test_a_refused_connection_with_no_commit_under_way_says_nothing_was_recorded(
    engine: Engine, proxied: tuple[CommitDropper, Engine], settings: Settings
) -> None:
    proxy, writer = proxied
    recorder = Recorder(writer, settings=settings)
    proxy.refuse(math.inf)
    with pytest.raises(DatabaseUnavailable, match="nothing was recorded") as raised:
        recorder.start_run(RunSnapshot("errors.1"), agent_id="errors-agent", run_id="never")
    assert not raised.value.maybe_recorded
    assert proxy.refused == 3  # every attempt tried to connect
    assert _sequences(engine, "never") == []


# (b) the reply is dropped, then a reconnect gets through --------------------------------

Act = Callable[[Run, list[str]], object]


def _tool(run: Run, done: list[str]) -> object:
    return run.call("note", done.append, "called")


def _effect(run: Run, done: list[str]) -> object:
    return run.effect("refund", done.append, arguments={"order": "O-1"}, key="k1")


@pytest.mark.parametrize(("act", "events"), [(_tool, 1), (_effect, 2)], ids=["tool", "effect"])
def test_a_cut_commit_then_a_reconnect_finds_the_event_and_carries_on(
    engine: Engine,
    proxied: tuple[CommitDropper, Engine],
    settings: Settings,
    act: Act,
    events: int,
) -> None:
    proxy, writer = proxied
    run = _started(writer, settings)
    done: list[str] = []
    proxy.cut(1)
    proxy.refuse(1)  # the first retry is refused, the second gets through
    act(run, done)  # no exception: the retry found the event in place
    assert proxy.cuts == 1
    assert proxy.refused == 1
    assert len(done) == 1  # the tool or the effect ran once
    run.now()
    assert _sequences(engine, run.run_id) == list(range(1, events + 3))
    if events == 2:
        assert _effects(engine) == [("k1", "confirmed")]
