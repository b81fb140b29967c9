"""Exactly-once appends when the connection drops right after COMMIT (issue 12, item 1).

A TCP proxy between the writer and Postgres lets the COMMIT reach the server, waits until
the server has committed, and drops the connection before the writer hears the answer.
A retry must find its own event (same event id, recorded time and chain hash) instead of
appending it again, ``start_run`` must recognise its own run, an effect must run once,
and when every attempt is cut the error says the event may have been recorded.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from agent_blackbox.outbox import AsyncRecorder, DatabaseUnavailable, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings
from tests.integration._pgproxy import CommitDropper, dropping_commits, through

pytestmark = pytest.mark.integration


@pytest.fixture
def proxied(engine: Engine) -> Iterator[tuple[CommitDropper, Engine]]:
    with dropping_commits(engine) as pair:
        yield pair


@pytest.fixture
def proxy(proxied: tuple[CommitDropper, Engine]) -> CommitDropper:
    return proxied[0]


@pytest.fixture
def writer(proxied: tuple[CommitDropper, Engine]) -> Engine:
    return proxied[1]


def _sequences(engine: Engine, run_id: str) -> list[int]:
    """The run's outbox sequences, checking no event id was appended twice."""
    with engine.connect() as conn:
        query = text("SELECT sequence, event_id::text FROM blackbox.outbox WHERE run_id = :r")
        rows = sorted((int(s), str(e)) for s, e in conn.execute(query, {"r": run_id}))
    assert len({e for _, e in rows}) == len(rows), "an event id was appended twice"
    return [s for s, _ in rows]


def _last_sequence(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        query = text("SELECT last_sequence FROM blackbox.runs WHERE run_id = :r")
        return int(conn.execute(query, {"r": run_id}).scalar_one())


def test_an_event_whose_commit_was_cut_is_appended_once(
    engine: Engine, writer: Engine, proxy: CommitDropper, settings: Settings
) -> None:
    run = Recorder(writer, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    calls: list[int] = []

    def double(n: int) -> int:
        calls.append(n)
        return n * 2

    proxy.cut(1)
    assert run.call("double", double, 21) == 42
    assert proxy.cuts == 1
    assert calls == [21]  # the tool ran once; only the append was retried
    run.now()
    assert _sequences(engine, run.run_id) == [1, 2, 3]
    assert _last_sequence(engine, run.run_id) == 3


def test_a_run_whose_start_was_cut_is_started_once(
    engine: Engine, writer: Engine, proxy: CommitDropper, settings: Settings
) -> None:
    proxy.cut(1)
    run = Recorder(writer, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    assert proxy.cuts == 1
    run.now()
    assert _sequences(engine, run.run_id) == [1, 2]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 1


def test_an_effect_intent_whose_commit_was_cut_is_recorded_once(
    engine: Engine, writer: Engine, proxy: CommitDropper, settings: Settings
) -> None:
    run = Recorder(writer, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    performed: list[str] = []
    proxy.cut(1)
    run.effect("refund", lambda key: performed.append(key), arguments={"order": "O-1"}, key="k1")
    assert proxy.cuts == 1
    assert performed == ["k1"]
    assert _sequences(engine, run.run_id) == [1, 2, 3]
    with engine.connect() as conn:
        effects = conn.execute(text("SELECT idempotency_key, status FROM blackbox.effects")).all()
    assert [tuple(e) for e in effects] == [("k1", "confirmed")]


def test_a_joined_transaction_whose_commit_was_cut_is_found_by_the_next_append(
    engine: Engine, writer: Engine, proxy: CommitDropper, settings: Settings
) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.tickets (id text PRIMARY KEY, state text)"))
    run = Recorder(writer, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    proxy.cut(1)

    # The agent's own transaction: its commit is the agent's, so the agent hears the cut.
    def notify() -> None:
        with writer.begin() as conn:
            conn.execute(text("INSERT INTO public.tickets VALUES ('T-1', 'notified')"))
            run.transition("notified", state={"ticket": "T-1"}, connection=conn)

    with pytest.raises(OperationalError):
        notify()
    assert proxy.cuts == 1
    run.now()  # the next append finds the committed transition and goes on after it
    assert _sequences(engine, run.run_id) == [1, 2, 3]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM public.tickets")).scalar_one() == 1


def test_when_every_attempt_is_cut_the_error_says_it_may_have_been_recorded(
    engine: Engine, writer: Engine, proxy: CommitDropper, settings: Settings
) -> None:
    run = Recorder(writer, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    proxy.cut(math.inf)
    with pytest.raises(DatabaseUnavailable, match="may have been recorded"):
        run.now()
    proxy.cut(0)
    run.now()  # the next append finds the first one in place and goes on after it
    assert _sequences(engine, run.run_id) == [1, 2, 3]


def test_the_async_recorder_appends_a_cut_event_once(
    engine: Engine, proxy: CommitDropper, settings: Settings
) -> None:
    async def scenario() -> str:
        writer = create_async_engine(through(engine.url, proxy))
        try:
            recorder = AsyncRecorder(writer, settings=settings)
            run = await recorder.start_run(RunSnapshot("amb.1"), agent_id="a")
            proxy.cut(1)
            assert await run.call("double", lambda n: n * 2, 21) == 42
            await run.now()
            return run.run_id
        finally:
            await writer.dispose()

    run_id = asyncio.run(scenario())
    assert proxy.cuts == 1
    assert _sequences(engine, run_id) == [1, 2, 3]
