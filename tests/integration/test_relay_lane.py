"""The relay's outbox lane keeps reads and deletes in the order they were handed over."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Connection, Engine

from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.outbox.relay._lane import OutboxLane
from agent_blackbox.outbox.relay._reader import _DELETE as _RELAY_DELETE
from agent_blackbox.outbox.relay._reader import _DELETE_SESSION, _READ_SESSION
from agent_blackbox.schemas import Settings

pytestmark = pytest.mark.integration

# The server-side pause is no synchronisation: with the lane's rules the results are the
# same however long it takes; it keeps the reading thread busy so that a delete that did
# not wait for the read handed over before it would run first, and show.
_PAUSE = "SELECT pg_sleep(0.3)::text"
_COUNT = "SELECT count(*) FROM blackbox.outbox WHERE run_id = %(run)s"
_DELETE = "DELETE FROM blackbox.outbox WHERE run_id = %(run)s"
_ANALYZED = (
    "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'blackbox.outbox'::regclass"
)


def _lane(engine: Engine) -> OutboxLane:
    return OutboxLane(
        engine,
        name="test",
        read_setup=_READ_SESSION,
        delete_setup=_DELETE_SESSION,
        setup_params={"idle_ms": "5000"},
    )


def test_a_read_sees_the_deletes_handed_over_before_it_and_none_after(
    settings: Settings, engine: Engine
) -> None:
    recorder = Recorder(engine, settings=settings)
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="lane")
    run.finish()
    lane = _lane(engine)
    try:
        paused = lane.read(_PAUSE, {})
        before = lane.read(_COUNT, {"run": run.run_id})
        deleted = lane.delete(_DELETE, {"run": run.run_id})
        after = lane.read(_COUNT, {"run": run.run_id})
        assert paused.result(timeout=30) == [("",)]
        assert before.result(timeout=30) == [(2,)]  # run.started, run.finished
        assert deleted.result(timeout=30) is None
        assert after.result(timeout=30) == [(0,)]
    finally:
        lane.close()


def test_a_failed_read_lets_the_deletes_after_it_run(settings: Settings, engine: Engine) -> None:
    recorder = Recorder(engine, settings=settings)
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="lane")
    run.finish()
    lane = _lane(engine)
    try:
        broken = lane.read("SELECT no_such_column FROM blackbox.outbox", {})
        deleted = lane.delete(_DELETE, {"run": run.run_id})
        after = lane.read(_COUNT, {"run": run.run_id})  # on a new session
        with pytest.raises(Exception, match="no_such_column"):
            broken.result(timeout=30)
        assert deleted.result(timeout=30) is None
        assert after.result(timeout=30) == [(0,)]
    finally:
        lane.close()


def _burst_into_an_outbox_vacuumed_empty(conn: Connection) -> None:
    """Vacuumed nearly empty, then filled by a burst (a backlog after an outage): the
    statistics still say the outbox holds almost nothing."""
    conn.exec_driver_sql(
        "INSERT INTO blackbox.outbox (shard, run_id, sequence, event_id, envelope) "
        "SELECT 0, 'x', 1, gen_random_uuid(), '\\x00' FROM generate_series(1, 100)"
    )
    conn.exec_driver_sql("ANALYZE blackbox.outbox")
    conn.exec_driver_sql("DELETE FROM blackbox.outbox")
    conn.exec_driver_sql("VACUUM blackbox.outbox")
    conn.exec_driver_sql(
        "INSERT INTO blackbox.outbox (shard, run_id, sequence, event_id, envelope) "
        "SELECT g %% 16, 'r' || g, 1, gen_random_uuid(), '\\x00' "
        "FROM generate_series(1, 20000) g"
    )


def test_after_a_burst_the_delete_probes_the_key_and_the_relay_may_refresh_statistics(
    engine: Engine,
) -> None:
    """With the statistics of an empty outbox, the planner walked every row of the
    leased shards for each delete (seconds a batch); after ``analyze_outbox()``, which
    the relay may call, it probes the primary key."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        _burst_into_an_outbox_vacuumed_empty(conn)
        conn.exec_driver_sql(
            "INSERT INTO blackbox.relay_leases (shard, owner, epoch, expires_at) "
            "SELECT s, 'plan', 1, now() + interval '1 minute' FROM generate_series(0, 15) s "
            "ON CONFLICT (shard) DO UPDATE SET owner = 'plan'"
        )
        first = conn.exec_driver_sql("SELECT min(id) FROM blackbox.outbox").scalar_one()
        ids = ",".join(str(first + i) for i in range(5000))
        conn.exec_driver_sql("SET ROLE blackbox_relay")
        conn.exec_driver_sql("SELECT blackbox.analyze_outbox()")
        conn.execute(_DELETE_SESSION, {"idle_ms": "5000"})
        plan = "\n".join(
            conn.exec_driver_sql("EXPLAIN " + _RELAY_DELETE, {"ids": ids, "me": "plan"})
            .scalars()
            .all()
        )
        conn.exec_driver_sql("RESET ROLE")
    assert "outbox_pkey" in plan, plan[:2000]
    assert "outbox_shard_id" not in plan, plan[:2000]


def test_a_relay_reading_a_full_batch_asks_for_fresh_statistics(
    settings: Settings, engine: Engine
) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        _burst_into_an_outbox_vacuumed_empty(conn)
        before = conn.exec_driver_sql(_ANALYZED).scalar_one()
    relay = Relay(engine, settings=settings, owner="stats", options=RelayOptions(batch_size=500))
    try:
        relay.drain_once()
        deadline = time.monotonic() + 30
        while True:
            with engine.connect() as conn:
                after = conn.exec_driver_sql(_ANALYZED).scalar_one()
            if after > before:
                break
            assert time.monotonic() < deadline, "no ANALYZE of the outbox within 30 s"
            time.sleep(0.05)  # polling the statistics view, with a deadline
    finally:
        relay.close()
