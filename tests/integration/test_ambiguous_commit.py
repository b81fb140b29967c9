"""Exactly-once appends when the connection drops right after COMMIT (issue 12, item 1).

The database committed, the writer heard an error: a retry must find its own event (same
event id, recorded time and chain hash) instead of appending it again, ``start_run`` must
recognise its own run, and when every attempt fails the error says the event may have
been recorded. The drop is made in the dialect's commit: the real COMMIT runs, then the
connection is closed and the driver's error raised, as a network cut would.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import DatabaseUnavailable, Recorder, RunSnapshot
from agent_blackbox.schemas import Settings

pytestmark = pytest.mark.integration


class CommitCutter:
    """Closes the connection after each of the next ``left`` COMMITs, then raises."""

    def __init__(self, engine: Engine) -> None:
        self._real: Callable[[Any], None] = engine.dialect.do_commit
        self.left: float = 0
        self.cuts = 0
        engine.dialect.do_commit = self._commit  # type: ignore[method-assign]

    def _commit(self, dbapi_connection: Any) -> None:
        self._real(dbapi_connection)
        if self.left > 0:
            self.left -= 1
            self.cuts += 1
            # the driver's own connection (what is passed in may be the pool's proxy)
            getattr(dbapi_connection, "driver_connection", dbapi_connection).close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")


def _rows(engine: Engine, run_id: str) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT sequence, event_id::text FROM blackbox.outbox WHERE run_id = :r"),
            {"r": run_id},
        )
        return sorted((int(s), str(e)) for s, e in rows)


def _last_sequence(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        query = text("SELECT last_sequence FROM blackbox.runs WHERE run_id = :r")
        return int(conn.execute(query, {"r": run_id}).scalar_one())


def test_an_event_whose_commit_was_cut_is_appended_once(engine: Engine, settings: Settings) -> None:
    cutter = CommitCutter(engine)
    run = Recorder(engine, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    calls: list[int] = []
    cutter.left = 1
    assert run.call("double", lambda n: calls.append(n) or n * 2, 21) == 42
    assert cutter.cuts == 1
    assert calls == [21]  # the tool ran once; only the append was retried
    run.now()
    rows = _rows(engine, run.run_id)
    assert [s for s, _ in rows] == [1, 2, 3]
    assert len({e for _, e in rows}) == 3
    assert _last_sequence(engine, run.run_id) == 3


def test_a_run_whose_start_was_cut_is_started_once(engine: Engine, settings: Settings) -> None:
    cutter = CommitCutter(engine)
    cutter.left = 1
    run = Recorder(engine, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    assert cutter.cuts == 1
    run.now()
    assert [s for s, _ in _rows(engine, run.run_id)] == [1, 2]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 1


def test_an_effect_intent_whose_commit_was_cut_is_recorded_once(
    engine: Engine, settings: Settings
) -> None:
    cutter = CommitCutter(engine)
    run = Recorder(engine, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    performed: list[str] = []
    cutter.left = 1
    run.effect("refund", lambda key: performed.append(key), arguments={"order": "O-1"}, key="k1")
    assert performed == ["k1"]
    assert [s for s, _ in _rows(engine, run.run_id)] == [1, 2, 3]
    with engine.connect() as conn:
        effects = conn.execute(text("SELECT idempotency_key, status FROM blackbox.effects")).all()
    assert [tuple(e) for e in effects] == [("k1", "confirmed")]


def test_when_every_attempt_is_cut_the_error_says_it_may_have_been_recorded(
    engine: Engine, settings: Settings
) -> None:
    cutter = CommitCutter(engine)
    run = Recorder(engine, settings=settings).start_run(RunSnapshot("amb.1"), agent_id="a")
    cutter.left = math.inf
    with pytest.raises(DatabaseUnavailable, match="may have been recorded"):
        run.now()
    cutter.left = 0
    run.now()  # the next append finds the first one in place and goes on after it
    rows = _rows(engine, run.run_id)
    assert [s for s, _ in rows] == [1, 2, 3]
