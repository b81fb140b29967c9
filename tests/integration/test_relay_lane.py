"""The relay's outbox lane keeps reads and deletes in the order they were handed over."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay._lane import OutboxLane
from agent_blackbox.outbox.relay._relay import _LANE_SESSION
from agent_blackbox.schemas import Settings

pytestmark = pytest.mark.integration

# The server-side pause is no synchronisation: with the lane's rules the results are the
# same however long it takes; it keeps the reading thread busy so that a delete that did
# not wait for the read handed over before it would run first, and show.
_PAUSE = "SELECT pg_sleep(0.3)::text"
_COUNT = "SELECT count(*) FROM blackbox.outbox WHERE run_id = %(run)s"
_DELETE = "DELETE FROM blackbox.outbox WHERE run_id = %(run)s"


def test_a_read_sees_the_deletes_handed_over_before_it_and_none_after(
    settings: Settings, engine: Engine
) -> None:
    recorder = Recorder(engine, settings=settings)
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="lane")
    run.finish()
    lane = OutboxLane(engine, name="test", setup=_LANE_SESSION, setup_params={"idle_ms": "5000"})
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
    lane = OutboxLane(engine, name="test", setup=_LANE_SESSION, setup_params={"idle_ms": "5000"})
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
