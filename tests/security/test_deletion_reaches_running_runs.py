"""Finding 7: deletion stops at a running run; and finding 8 (part): content survives
``forget``.

A subject's run that is still marked running (its writer crashed) must not shield the
subject's later runs: ``forget`` shreds those and reports the running one (exit 1), and
retention marks the silent run abandoned and then expires it. After ``forget``, no value
the agent recorded about the customer remains in what the reader role can read
(``blackbox.runs``, the views' runs and events rows, the analytics views), nor in
``blackbox.effects``.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from agent_blackbox.cli import main
from agent_blackbox.consumers import AnalyticsConsumer, RetentionJob, RetentionPolicy
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, EffectOutcome, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._views import build_views
from tests.integration._wait import eventually
from tests.security.conftest import TENANT_A

pytestmark = pytest.mark.integration

PROVIDER = LocalKeyProvider({"v1": os.urandom(32)})
POLICY = RetentionPolicy.from_mapping({"standard": {"bodies_days": 30, "metadata_days": 400}})


def _recorder(engine: Engine, settings: Settings) -> Recorder:
    return Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))


def _crashed(engine: Engine, settings: Settings, subject: str) -> str:
    """A run whose writer died after one tool call: still marked running."""
    snapshot = RunSnapshot(code_version="security.7", input={"who": subject})
    run = _recorder(engine, settings).start_run(
        snapshot, agent_id="security-7", tenant_id=TENANT_A, subject_ids=(subject,)
    )
    run.call("lookup", lambda who: {"plan": f"{who}: gold"}, subject)
    return run.run_id


def _refund_agent(run: AgentRun, input: Any) -> Any:
    """An agent that puts the customer's id and e-mail where agents do: its state name,
    an effect's idempotency key, and the external system's id for it."""
    customer, email = input["customer"], input["email"]
    run.transition(f"refunding {customer}", state={"customer": customer}, reason="refund")
    receipt = run.effect(
        "refund",
        lambda key: EffectOutcome(external_id=f"rf-{customer}-{email}", result={"ok": True}),
        arguments={"amount": 12},
        key=f"refund-{customer}-{email}",
    )
    run.transition(f"refunded {customer} <{email}>", state={"done": True})
    return receipt.status


def _ended(engine: Engine, settings: Settings, subject: str, email: str) -> str:
    # A tag naming the customer is a misuse (tags are labels), and forget clears it too.
    snapshot = RunSnapshot(
        code_version="security.7",
        input={"customer": subject, "email": email},
        tags={"customer": subject},
    )
    run, _ = _recorder(engine, settings).record(
        _refund_agent,
        snapshot,
        agent_id="security-7",
        tenant_id=TENANT_A,
        subject_ids=(subject,),
    )
    return run.run_id


def _cli(settings: Settings, *args: str) -> Any:
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_TOPIC": settings.topic,
        "COLUMNS": "300",
    }
    env.pop("BLACKBOX_SIGNING_KEY_FILE", None)
    return CliRunner(env=env).invoke(main, list(args))


def _live_keys(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM blackbox.data_keys "
                    "WHERE run_id = :r AND wrapped IS NOT NULL"
                ),
                {"r": run_id},
            ).scalar_one()
        )


def test_forget_goes_past_a_running_run_and_abandoned_runs_expire(
    engine: Engine, settings: Settings
) -> None:
    subject = f"cust-{uuid.uuid4().hex[:8]}"
    running = _crashed(engine, settings, subject)
    later = _ended(engine, settings, subject, "erin@example.com")  # after the running one

    result = _cli(settings, "forget", "--subject", subject)
    assert result.exit_code == 1, result.output
    assert "still recording" in result.stderr
    assert running in result.stderr
    assert _live_keys(engine, later) == 0  # the later run was shredded all the same
    assert _live_keys(engine, running) == 1

    start = datetime.now(UTC)

    def job(days: float) -> RetentionJob:
        at = start + timedelta(days=days)
        return RetentionJob(
            engine, policy=POLICY, settings=settings, clock=lambda: at, abandon_after=timedelta(1)
        )

    assert job(0.5).run_once().abandoned == ()
    assert job(2).run_once().abandoned == (running,)
    assert [r.run_id for r in job(31).run_once().redacted] == [running]
    assert _live_keys(engine, running) == 0
    again = _cli(settings, "forget", "--subject", subject)
    assert again.exit_code == 0, again.output


def _readable(reader: Engine, table: str, run_id: str) -> list[str]:
    """Every row of ``table`` about ``run_id`` the reader can see, as text."""
    with reader.connect() as conn:
        rows = conn.execute(text(f"SELECT * FROM {table} WHERE run_id = :r"), {"r": run_id})
        return [repr(tuple(row)) for row in rows]


def test_after_forget_no_customer_value_remains_where_the_reader_looks(
    engine: Engine, settings: Settings, login: Login
) -> None:
    customer, email = f"cust-{uuid.uuid4().hex[:8]}", "dana.smith@example.com"
    run_id = _ended(engine, settings, customer, email)
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
        build_views(settings, engine, expect=6)  # started, 2 transitions, intent, receipt, end
        report = RetentionJob(engine, policy=POLICY, settings=settings).forget(customer)
        assert [r.run_id for r in report.redacted] == [run_id]
        relay.drain(timeout=60)
    finally:
        relay.close()
    build_views(settings, engine, expect=7)  # and run.redacted
    with AnalyticsConsumer(settings, group_id="security-7", engine=engine) as analytics:
        seen_messages = 0

        def analysed() -> bool:
            nonlocal seen_messages
            outcome = analytics.poll_once(0.5)
            seen_messages += outcome.messages if outcome is not None else 0
            return seen_messages >= 7

        eventually(analysed, timeout=60, what="the analytics consumer caught up")

    reader = login("blackbox_reader", tenant=TENANT_A)
    seen: list[str] = []
    for table in ("blackbox.runs", "blackbox_views.runs", "blackbox_views.events"):
        seen += _readable(reader, table, run_id)
    assert len(seen) == 1 + 1 + 7  # the reader does see the run; only its values are gone
    analysed_rows = []
    for table in ("run_rollups", "effects", "llm_calls", "tool_calls"):
        analysed_rows += _readable(reader, f"blackbox_views.{table}", run_id)
    assert len(analysed_rows) == 2  # the run's rollup and its effect: counted, no value
    seen += analysed_rows
    key = f"refund-{customer}-{email}"
    assert not [
        row for row in analysed_rows if hashlib.sha256(key.encode()).hexdigest()[:32] in row
    ]
    with pytest.raises(ProgrammingError, match="permission denied"):
        _readable(reader, "blackbox.effects", run_id)
    with engine.connect() as conn:  # what a dump of the write side holds
        effects = conn.execute(
            text("SELECT * FROM blackbox.effects WHERE run_id = :r"), {"r": run_id}
        ).all()
        events = conn.execute(
            text(
                "SELECT DISTINCT input_digest, output_digest FROM blackbox_views.events "
                "WHERE run_id = :r"
            ),
            {"r": run_id},
        ).all()
    assert len(effects) == 1  # still counted
    seen += [repr(tuple(row)) for row in effects]
    for value in (customer, email, "dana.smith"):
        leaks = [row for row in seen if value in row]
        assert leaks == [], f"{value!r} survived forget in {leaks}"
    # Digests of the shredded run's values are gone too: they would confirm a guess.
    assert [tuple(row) for row in events] == [("shredded", "shredded")]
