"""The pipelined relay keeps a run's order when a lower id is committed late."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import Settings
from tests.integration._kafka import read_topic

pytestmark = pytest.mark.integration

_ROWS = text(
    "SELECT id, shard, run_id, sequence, event_id, envelope FROM blackbox.outbox "
    "WHERE run_id = :run ORDER BY id"
)
_PUT = text(
    "INSERT INTO blackbox.outbox (id, shard, run_id, sequence, event_id, envelope) "
    "OVERRIDING SYSTEM VALUE VALUES (:id, :shard, :run_id, :sequence, :event_id, :envelope)"
)


def _record(recorder: Recorder, agent: str) -> str:
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id=agent)
    run.finish()
    return run.run_id


def test_a_row_committed_late_below_the_last_one_read_is_published_first(
    settings: Settings, engine: Engine
) -> None:
    recorder = Recorder(engine, settings=settings)
    gap_run = _record(recorder, "gap")  # its ids are freed below the others'
    other_runs = [_record(recorder, f"other-{i}") for i in range(3)]
    late_run = _record(recorder, "late")
    with engine.begin() as conn:
        free = [r.id for r in conn.execute(_ROWS, {"run": gap_run})]
        late = [r._asdict() for r in conn.execute(_ROWS, {"run": late_run})]
        conn.execute(
            text("DELETE FROM blackbox.outbox WHERE run_id IN (:a, :b)"),
            {"a": gap_run, "b": late_run},
        )
    relay = Relay(engine, settings=settings, options=RelayOptions(batch_size=2, lease_ttl_s=5.0))
    try:
        relay.rebalance()
        assert relay.drain_once() > 0  # two rows in flight, reads go on after them
        # The late run's first event commits now with an id below those already read,
        # its second (committed after it) above them.
        with engine.begin() as conn:
            conn.execute(_PUT, {**late[0], "id": free[0]})
            conn.execute(_PUT, late[1])
        while relay.drain_once():
            pass
    finally:
        relay.close()
    total = 2 * len(other_runs) + 2
    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=total)
    assert len(messages) == total
    late_events = [env for _, _, env in sorted(messages) if env.run_id == late_run]
    assert [env.sequence for env in late_events] == [1, 2]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one() == 0
