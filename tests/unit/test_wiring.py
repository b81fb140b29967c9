"""The pool policy: every kind of process gets a named pool, and an engine built with it
has that pool's sizes."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, NullPool, QueuePool
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_blackbox.outbox import AsyncRecorder, Recorder
from agent_blackbox.schemas import Settings
from agent_blackbox.wiring import (
    AGENT_POOL,
    COMMAND_POOL,
    POOLS,
    SERVICE_POOL,
    Pool,
)

# Nothing listens there: no test connects.
NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:1/none"


@pytest.mark.parametrize("pool", POOLS, ids=lambda pool: pool.role)
def test_an_engine_has_its_pools_sizes(pool: Pool) -> None:
    engine = pool.engine(NOWHERE)
    try:
        _assert_sized(engine, pool)
    finally:
        engine.dispose()


@pytest.mark.parametrize("pool", POOLS, ids=lambda pool: pool.role)
def test_an_async_engine_has_its_pools_sizes(pool: Pool) -> None:
    engine = pool.async_engine(NOWHERE)
    assert isinstance(engine, AsyncEngine)
    _assert_sized(engine.sync_engine, pool)


def _assert_sized(engine: Engine, pool: Pool) -> None:
    if pool.size == 0:
        assert isinstance(engine.pool, NullPool)
        return
    assert isinstance(engine.pool, QueuePool)
    assert engine.pool.size() == pool.size
    assert engine.pool._max_overflow == pool.overflow
    assert engine.pool._pre_ping is pool.pre_ping


def test_the_policy_names_a_pool_for_each_kind_of_process() -> None:
    assert {pool.role for pool in POOLS} == {"agent", "command", "service", "migration"}
    # An agent records an event per transaction: a pre-ping would add a round trip to each.
    assert not AGENT_POOL.pre_ping
    # A process that runs for days survives the database's restarts.
    assert SERVICE_POOL.pre_ping
    assert COMMAND_POOL.size < SERVICE_POOL.size < AGENT_POOL.size


def test_an_engine_may_commit_each_statement_itself() -> None:
    engine = COMMAND_POOL.engine(NOWHERE, isolation_level="AUTOCOMMIT")
    try:
        assert engine.dialect._on_connect_isolation_level == "AUTOCOMMIT"
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("size", "overflow"), [(-1, 0), (2, -1), (0, 3)], ids=["size", "overflow", "nothing"]
)
def test_a_pool_that_cannot_work_is_refused(size: int, overflow: int) -> None:
    with pytest.raises(ValueError, match="pool 'odd'"):
        Pool("odd", size=size, overflow=overflow)


def test_the_recorders_convenience_builds_an_agents_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLACKBOX_KEK_PUBLIC_FILE", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK", raising=False)
    settings = Settings(database_url=NOWHERE)
    recorder = Recorder.from_settings(settings)
    try:
        _assert_sized(recorder.engine, AGENT_POOL)
        assert recorder.settings is settings
    finally:
        recorder.engine.dispose()
    recorder_async = AsyncRecorder.from_settings(settings)
    _assert_sized(recorder_async.engine.sync_engine, AGENT_POOL)
