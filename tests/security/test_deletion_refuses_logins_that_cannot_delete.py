"""A login that may not delete is refused before ``forget`` or ``ledger reapply`` looks.

Row security shows a reader or a replayer only its own tenants' runs. ``forget`` run
with such a login found no run linked to another tenant's subject and said so with exit
0, as if the request were done; ``ledger reapply`` said the same of an empty ledger.
Both are the owner's work (the roles table of the privacy guide): any other login is
refused with exit 2, naming what it lacks, and nothing is looked at or changed.
"""

from __future__ import annotations

import os
import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import RetentionJob, RetentionPolicy, reapply_ledger
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import PermissionRefused, Settings
from tests.conftest import Login
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

POLICY = RetentionPolicy.from_mapping({"standard": {"bodies_days": 30, "metadata_days": 400}})


def _subject_run(engine: Engine, settings: Settings, subject: str) -> str:
    snapshot = RunSnapshot(code_version="security.forget-role", input={"who": subject})
    run, _ = Recorder(engine, settings=settings).record(
        lambda run, input: run.call("lookup", lambda: {"plan": "gold"}),
        snapshot,
        agent_id="security-forget-role",
        tenant_id=TENANT_B,
        subject_ids=(subject,),
    )
    return run.run_id


def _cli(settings: Settings, login: Engine, *args: str) -> object:
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": login.url.render_as_string(hide_password=False),
        "BLACKBOX_TOPIC": settings.topic,
        "COLUMNS": "300",
    }
    return CliRunner(env=env).invoke(main, list(args))


def _linked(engine: Engine, run_id: str) -> list[str]:
    with engine.connect() as conn:
        query = text("SELECT subject_ids FROM blackbox.runs WHERE run_id = :r")
        return list(conn.execute(query, {"r": run_id}).scalar_one())


@pytest.mark.parametrize("role", ["blackbox_reader", "blackbox_replayer", "blackbox_writer"])
def test_forget_with_a_login_that_may_not_delete_is_refused_not_reported_done(
    engine: Engine, settings: Settings, login: Login, role: str
) -> None:
    subject = f"cust-{uuid.uuid4().hex[:8]}"
    run_id = _subject_run(engine, settings, subject)  # tenant B's: the login sees tenant A
    other = login(role, tenant=TENANT_A)

    job = RetentionJob(other, policy=POLICY, settings=settings)
    with pytest.raises(PermissionRefused, match="deletion_ledger"):
        job.forget(subject)
    result = _cli(settings, other, "forget", "--subject", subject)
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "no run is linked" not in result.output  # type: ignore[attr-defined]
    assert "permission denied" in result.output  # type: ignore[attr-defined]
    assert _linked(engine, run_id) == [subject]  # nothing was forgotten


def test_ledger_reapply_with_a_reader_is_refused_even_with_nothing_to_apply(
    engine: Engine, login: Login
) -> None:
    reader = login("blackbox_reader", tenant=TENANT_A)
    with pytest.raises(PermissionRefused, match=r"UPDATE on blackbox\.data_keys"):
        reapply_ledger(reader, [])
    reapply_ledger(engine, [])  # the owner may: nothing to apply, nothing refused
