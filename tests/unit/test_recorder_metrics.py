"""The recorder counts the writes it could not make, by the error the agent got."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import create_engine

from agent_blackbox.outbox import DatabaseUnavailable, Recorder, RunSnapshot

NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=1"


def _failures(kind: str) -> float:
    return REGISTRY.get_sample_value("blackbox_recorder_write_failures_total", {"kind": kind}) or 0


def test_a_write_the_database_refused_is_counted_and_raised() -> None:
    before = _failures("DatabaseUnavailable")
    with pytest.raises(DatabaseUnavailable):
        Recorder(create_engine(NOWHERE)).start_run(RunSnapshot(code_version="v1"), agent_id="a")
    assert _failures("DatabaseUnavailable") == before + 1
