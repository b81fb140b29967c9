"""A backup taken before a deletion request brings back nothing of the forgotten subject.

Attack: a subject's runs are backed up (to the S3 store), then the subject is forgotten.
An investigator restores the backup (``restore --subject``, or a whole restore by a
kept drill) and, logged in to the copy as each role, hunts every table it can read for
the subject's id, the effect's idempotency key and external id, the session id, and the
digests the views held of the run before the deletion. Nothing is found: the restore
applies ``forget``'s scrub to runs, effects and views from the deletion ledger before
the copy is handed over, and the subject can no longer be selected by id. Another
subject's run, backed up alongside and never forgotten, is found whole (the hunt sees
what it should).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from agent_blackbox.backup import open_store
from agent_blackbox.consumers import RetentionJob, RetentionPolicy
from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox import AgentRun, EffectOutcome, Recorder, RunSnapshot
from agent_blackbox.outbox._tenants import grant_tenant_txn
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._backups import PROVIDER, SIGNER, cut, events, relay
from tests.integration._views import build_views
from tests.security._restores import Copies, copies  # noqa: F401

pytestmark = pytest.mark.integration

FORGOTTEN = f"cust-{uuid.uuid4().hex[:8]}"
KEPT = f"cust-{uuid.uuid4().hex[:8]}"
ROLES = ("blackbox_reader", "blackbox_replayer", "blackbox_writer", "blackbox_relay")
# Owner-only by design: the ledger keeps which subject a destruction was for.
LEDGER = "blackbox.deletion_ledger"


def refund_agent(run: AgentRun, input: Any) -> Any:
    """Looks a customer up, refunds them, and keeps them in its state."""
    who = input["who"]
    found = run.call("lookup", lambda name: {"address": f"{name} lives at 1 Main St"}, who)
    run.effect(
        "refund",
        lambda _key: EffectOutcome(external_id=f"rf-{who}", result={"ok": True}),
        arguments={"customer": who},
        key=f"refund-{who}",
    )
    run.transition("refunded", state={"customer": who, "address": found["address"]})
    return {"refunded": who}


def _record(engine: Engine, settings: Settings, who: str) -> str:
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    run, _ = recorder.record(
        refund_agent,
        RunSnapshot(code_version="forget.1", input={"who": who}),
        agent_id="refunds",
        subject_ids=(who,),
        session_id=f"session-{who}",
        user_id=who,
    )
    return run.run_id


def _traces(engine: Engine, run_id: str) -> set[str]:
    """What the production views hold of ``run_id`` that names its subject: digests,
    the user id's digest and the session id."""
    with engine.connect() as conn:
        digests = conn.execute(
            text("SELECT input_digest, output_digest FROM blackbox_views.events WHERE run_id = :r"),
            {"r": run_id},
        ).all()
        labels = conn.execute(
            text("SELECT session_id, user_id FROM blackbox_views.runs WHERE run_id = :r"),
            {"r": run_id},
        ).one()
    found = {d for pair in digests for d in pair if d} | {v for v in labels if v}
    assert len(found) > 4, found  # the views held values of the subject to hunt for
    return found


@pytest.fixture
def backed_up(settings: Settings, engine: Engine, s3_url: str) -> dict[str, Any]:
    """Both subjects' runs recorded, published, indexed and backed up; then FORGOTTEN
    is forgotten. The runs, and what production's views held of each before."""
    runs = {who: _record(engine, settings, who) for who in (FORGOTTEN, KEPT)}
    relay(engine, settings)
    build_views(settings, engine, expect=events(engine))
    held = {who: _traces(engine, run_id) for who, run_id in runs.items()}
    # A digest both runs hold (of the same refund result, say) names neither subject.
    traces = {
        who: found - held[KEPT if who == FORGOTTEN else FORGOTTEN] for who, found in held.items()
    }
    cut(settings, engine, open_store(s3_url))
    job = RetentionJob(
        engine,
        policy=RetentionPolicy.from_mapping(
            {"standard": {"bodies_days": 30, "metadata_days": 400}}
        ),
        settings=settings,
        signer=SIGNER,
    )
    assert [r.run_id for r in job.forget(FORGOTTEN).redacted] == [runs[FORGOTTEN]]
    relay(engine, settings)
    return {"runs": runs, "traces": traces}


def _env_url(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("export BLACKBOX_DATABASE_URL="):
            return line.split("=", 1)[1].strip("'")
    raise AssertionError(f"no database URL in {path}")


def _readable_tables(conn: Any) -> list[str]:
    return list(
        conn.execute(
            text(
                "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
                "WHERE schemaname IN ('blackbox', 'blackbox_views') "
                "AND CASE WHEN has_schema_privilege(schemaname, 'USAGE') "
                "THEN has_table_privilege(format('%I.%I', schemaname, tablename), 'SELECT') "
                "ELSE false END "
                "ORDER BY 1"
            )
        ).scalars()
    )


def _hunt(url: str, needles: set[str], *, skip: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """needle → the tables (readable at ``url``) some row of which holds it as text."""
    engine = create_engine(url)
    found: dict[str, list[str]] = {}
    try:
        with engine.connect() as conn:
            tables = [t for t in _readable_tables(conn) if t not in skip]
            assert tables
            for table in tables:
                for needle in needles:
                    hit = conn.execute(
                        text(f"SELECT EXISTS (SELECT 1 FROM {table} AS t WHERE t::text LIKE :n)"),
                        {"n": f"%{needle}%"},
                    ).scalar_one()
                    if hit:
                        found.setdefault(needle, []).append(table)
    finally:
        engine.dispose()
    return found


def _subject_runs(url: str, subject: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if "blackbox.runs" not in _readable_tables(conn):
                return []  # this role selects no run at all
            rows = conn.execute(
                text("SELECT run_id FROM blackbox.runs WHERE :s = ANY(subject_ids)"),
                {"s": subject},
            )
            return [str(r) for r in rows.scalars()]
    finally:
        engine.dispose()


@pytest.fixture
def logins_into(login: Login) -> Any:
    """``logins_into(copy_url)``: a URL per role for a fresh login user in it, allowed to
    connect to the copy and granted every tenant there (as an investigator would be)."""

    def make(copy_url: str) -> dict[str, str]:
        owner = create_engine(copy_url)
        urls = {}
        try:
            for role in ROLES:
                user = str(login(role).url.username)
                with owner.begin() as conn:
                    database = make_url(copy_url).database
                    conn.execute(text(f"GRANT CONNECT ON DATABASE {database} TO {user}"))
                    grant_tenant_txn(conn, user, "*")
                urls[role] = (
                    make_url(copy_url)
                    .set(username=user, password=None)
                    .render_as_string(hide_password=False)
                )
        finally:
            owner.dispose()
        return urls

    return make


def _assert_forgotten(copy_url: str, logins: dict[str, str], backed: dict[str, Any]) -> None:
    forgotten = {FORGOTTEN, *backed["traces"][FORGOTTEN]}
    kept = {KEPT, *backed["traces"][KEPT]}
    seats = {"owner": copy_url, **logins}
    for seat, url in seats.items():
        skip = (LEDGER,) if seat == "owner" else ()
        assert _hunt(url, forgotten, skip=skip) == {}, seat
        assert _subject_runs(url, FORGOTTEN) == [], seat
    # The hunt finds what it should: the other subject's run came back whole.
    assert set(_hunt(copy_url, kept)) == kept
    assert _subject_runs(copy_url, KEPT) == [backed["runs"][KEPT]]
    assert _subject_runs(logins["blackbox_reader"], KEPT) == [backed["runs"][KEPT]]


def test_a_restore_of_the_subject_brings_back_no_value_of_theirs(
    login: Login,
    copies: Copies,  # noqa: F811
    logins_into: Any,
    backed_up: dict[str, Any],
    tmp_path: Path,
) -> None:
    name = copies.restore_name(f"f{uuid.uuid4().hex[:10]}")
    env_file = tmp_path / f"{name}.env"
    runs = backed_up["runs"]
    restored = copies.cli(
        "restore",
        "--into",
        name,
        *("--runs", f"{runs[FORGOTTEN]},{runs[KEPT]}"),
        *("--purpose", "complaint 9", "--env-file", str(env_file)),
    )
    assert restored.exit_code == 0, restored.output
    assert "restored 2 runs" in restored.output

    url = _env_url(env_file)
    _assert_forgotten(url, logins_into(url), backed_up)


def test_selecting_the_forgotten_subject_restores_their_run_scrubbed(
    login: Login,
    copies: Copies,  # noqa: F811
    logins_into: Any,
    backed_up: dict[str, Any],
    tmp_path: Path,
) -> None:
    name = copies.restore_name(f"f{uuid.uuid4().hex[:10]}")
    env_file = tmp_path / f"{name}.env"
    restored = copies.cli(
        "restore",
        *("--into", name, "--subject", FORGOTTEN, "--purpose", "complaint 9"),
        *("--env-file", str(env_file)),
    )
    assert restored.exit_code == 0, restored.output
    assert "restored 1 runs" in restored.output

    url = _env_url(env_file)
    logins = logins_into(url)
    for seat, seat_url in {"owner": url, **logins}.items():
        skip = (LEDGER,) if seat == "owner" else ()
        assert _hunt(seat_url, {FORGOTTEN, *backed_up["traces"][FORGOTTEN]}, skip=skip) == {}
        assert _subject_runs(seat_url, FORGOTTEN) == []


def test_a_whole_restore_brings_back_no_value_of_theirs(
    login: Login,
    copies: Copies,  # noqa: F811
    logins_into: Any,
    backed_up: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # where the kept copy's credentials are written
    drilled = copies.cli("drill", "--keep", "--sample", "0", "--json")
    [env_file] = tmp_path.glob("blackbox_drill_*.env")
    copies.keep(env_file.name.removesuffix(".env"))
    assert drilled.exit_code == 0, drilled.output

    url = _env_url(env_file)
    _assert_forgotten(url, logins_into(url), backed_up)


def test_a_drill_fails_a_copy_whose_views_kept_the_forgotten_run(
    copies: Copies,  # noqa: F811
    backed_up: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A restore that forgot the views' scrub (a regression) is caught by the drill.
    monkeypatch.setattr("agent_blackbox.backup._copy.scrub_views", lambda _engine: [])
    drilled = copies.cli("drill", "--sample", "0", "--json")

    assert drilled.exit_code == 1, drilled.output
    report = json.loads(drilled.stdout)
    [failed] = [c for c in report["checks"] if c["passed"] is False]
    assert failed["name"] == "forgotten stays unreadable"
    assert failed["where"] == [
        f"run {backed_up['runs'][FORGOTTEN]}: the views still hold its digests or labels"
    ]
