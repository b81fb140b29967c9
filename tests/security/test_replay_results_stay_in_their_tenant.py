"""Replay results are written by replayers and read by readers, each within its tenants,
and only through the checked function.

Attacks: a replayer granted tenant A records a result for a run of tenant B (to make B's
pass rate look better or worse), or inserts rows straight into the table (a thousand
PASS rows for a code version never tested, a row for B's run labelled with A's tenant);
a reader of tenant A reads B's results, or the values a replay kept behind a purpose.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from agent_blackbox.consumers import ViewReplayResults, ViewStoreUnavailable
from agent_blackbox.consumers._redacted_views import forget_run_labels_txn
from tests.conftest import Login
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

_RUN = text(
    "INSERT INTO blackbox_views.runs (run_id, tenant_id, agent_id, last_event_at) "
    "VALUES (:run, :tenant, 'agent', :at)"
)


def _report(run_id: str, result: str = "PASS") -> SimpleNamespace:
    return SimpleNamespace(
        run_id=run_id, result=result, divergence=None, events=3, duration_ms=1.0, kept=None
    )


def _diverged(run_id: str) -> SimpleNamespace:
    divergence = SimpleNamespace(
        kind=SimpleNamespace(value="argument_mismatch"),
        sequence=2,
        summary="argument_mismatch at sequence 2: changed: args[0]",
    )
    kept = SimpleNamespace(data=b'{"changes":[{"path":"args[0]","actual":"secret"}]}', key_id=None)
    return SimpleNamespace(
        run_id=run_id,
        result="DIVERGED",
        divergence=divergence,
        events=2,
        duration_ms=1.0,
        kept=kept,
    )


@pytest.fixture
def runs(engine: Engine) -> None:
    with engine.begin() as conn:
        for run, tenant in (("run-a", TENANT_A), ("run-b", TENANT_B)):
            conn.execute(_RUN, {"run": run, "tenant": tenant, "at": datetime.now(UTC)})


def _kept(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT run_id, tenant_id, recorded_by FROM blackbox_views.replay_results")
        )
        return sorted((r[0], r[1], r[2]) for r in rows)


@pytest.mark.usefixtures("runs")
def test_a_replayer_records_results_of_its_tenants_runs_only(engine: Engine, login: Login) -> None:
    replayer = ViewReplayResults(login("blackbox_replayer", tenant=TENANT_A))

    replayer.record(_report("run-a"), code_version="v1")  # type: ignore[arg-type]
    with pytest.raises(ViewStoreUnavailable, match="not in a tenant this login is granted"):
        replayer.record(_report("run-b"), code_version="v1")  # type: ignore[arg-type]

    kept = _kept(engine)
    assert [(run, tenant) for run, tenant, _ in kept] == [("run-a", TENANT_A)]
    assert kept[0][2].startswith("sec_replayer_")  # the login that wrote it, named
    reader = login("blackbox_reader", tenant=TENANT_B)
    with reader.connect() as conn:
        seen = conn.execute(text("SELECT run_id FROM blackbox_views.replay_results")).all()
    assert seen == []


@pytest.mark.usefixtures("runs")
def test_replay_results_cannot_be_inserted_around_the_checked_function(
    engine: Engine, login: Login
) -> None:
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    forged = text(
        "INSERT INTO blackbox_views.replay_results (run_id, tenant_id, code_version, result, "
        "passed, events) SELECT :run, :tenant, 'never-tested', 'PASS', true, 1 "
        "FROM generate_series(1, 1000)"
    )
    for run, tenant in (("run-a", TENANT_A), ("run-b", TENANT_A)):
        with replayer.begin() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(forged, {"run": run, "tenant": tenant})
    # Through the function: a result nobody replays is refused, and passed follows the
    # result whatever the caller would like it to be.
    results = ViewReplayResults(replayer)
    with pytest.raises(ViewStoreUnavailable, match="not one a replay reports"):
        results.record(_report("run-a", result="PASSED!"), code_version="v1")  # type: ignore[arg-type]
    with pytest.raises(ViewStoreUnavailable, match="not in the views"):
        results.record(_report("run-nowhere"), code_version="v1")  # type: ignore[arg-type]
    reader = login("blackbox_reader", tenant=TENANT_A)
    with reader.begin() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(
            text(
                "SELECT blackbox_views.record_replay_result('run-a', 'v', 'PASS', "
                "NULL, NULL, 1, 1.0, NULL, NULL, NULL)"
            )
        )
    assert _kept(engine) == []


@pytest.mark.usefixtures("runs")
def test_the_values_a_replay_kept_are_for_replayers_and_go_with_forget(
    engine: Engine, login: Login
) -> None:
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    ViewReplayResults(replayer).record(_diverged("run-a"), code_version="v2")  # type: ignore[arg-type]

    reader = login("blackbox_reader", tenant=TENANT_A)
    with reader.connect() as conn:
        seen = conn.execute(
            text("SELECT divergence_detail, values_kept FROM blackbox_views.replay_results")
        ).one()
        assert seen == ("argument_mismatch at sequence 2: changed: args[0]", True)
    for column in ("divergence_values", "values_key_id", "*"):
        with reader.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text(f"SELECT {column} FROM blackbox_views.replay_results"))
    with replayer.connect() as conn:
        (values,) = conn.execute(
            text("SELECT divergence_values FROM blackbox_views.replay_results")
        ).scalars()
    assert b"secret" in bytes(values)

    with engine.begin() as conn:
        forget_run_labels_txn(conn, ["run-a"])
    with replayer.connect() as conn:
        row = conn.execute(
            text(
                "SELECT divergence_values, values_kept, divergence_detail "
                "FROM blackbox_views.replay_results"
            )
        ).one()
    assert row == (None, False, "argument_mismatch at sequence 2: changed: args[0]")
