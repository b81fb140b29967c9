"""Replay results are written by replayers and read by readers, each within its tenants.

Attack: a replayer granted tenant A records a result for a run of tenant B (to make B's
pass rate look better or worse), and a reader of tenant A reads B's results.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.consumers import ViewReplayResults
from tests.conftest import Login
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

_RUN = text(
    "INSERT INTO blackbox_views.runs (run_id, tenant_id, agent_id, last_event_at) "
    "VALUES (:run, :tenant, 'agent', :at)"
)


def _report(run_id: str) -> SimpleNamespace:
    return SimpleNamespace(run_id=run_id, result="PASS", divergence=None, events=3, duration_ms=1.0)


def test_a_replayer_records_results_of_its_tenants_runs_only(engine: Engine, login: Login) -> None:
    with engine.begin() as conn:
        for run, tenant in (("run-a", TENANT_A), ("run-b", TENANT_B)):
            conn.execute(_RUN, {"run": run, "tenant": tenant, "at": datetime.now(UTC)})
    replayer = ViewReplayResults(login("blackbox_replayer", tenant=TENANT_A))

    replayer.record(_report("run-a"), code_version="v1")  # type: ignore[arg-type]
    replayer.record(_report("run-b"), code_version="v1")  # type: ignore[arg-type]

    with engine.connect() as conn:
        kept = conn.execute(text("SELECT run_id FROM blackbox_views.replay_results")).scalars()
        assert sorted(kept) == ["run-a"]
    reader = login("blackbox_reader", tenant=TENANT_B)
    with reader.connect() as conn:
        seen = conn.execute(text("SELECT run_id FROM blackbox_views.replay_results")).all()
    assert seen == []
