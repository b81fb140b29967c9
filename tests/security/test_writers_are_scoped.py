"""Finding 1: writers were not scoped.

As a writer of tenant B (and as a second writer of tenant A), try what the finding saw:
rewrite another run's metadata and effects, append correctly chained events (a forged
``run.finished``, a ``run.redacted`` after the end) to runs it did not start, append a
plaintext body to a sealed run. Each is refused and nothing changes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import ProgrammingError

from agent_blackbox.cli import main
from agent_blackbox.keystore import DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import (
    AgentRun,
    ConcurrentRunWriter,
    Recorder,
    RunNotActive,
    RunSnapshot,
    WriterRefused,
)
from agent_blackbox.outbox._boundaries import run_finished
from agent_blackbox.outbox._core import new_factory, utc_now
from agent_blackbox.outbox._postgres import load_run_txn
from agent_blackbox.outbox._writer import new_event_id
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import EVERY_TENANT, grant_tenant_txn
from agent_blackbox.schemas import Settings
from tests.conftest import Login
from tests.integration._agents import noise
from tests.integration._views import build_views
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

ROWS = (
    "SELECT run_id, subject_ids, retention_class, status, last_sequence, chain_head "
    "FROM blackbox.runs ORDER BY run_id"
)


def agent(run: AgentRun, input: Any) -> Any:
    run.effect("refund", lambda key: {"refund_id": "R-1"}, arguments={"order": input["order"]})
    return {"ok": True}


def _record(writer: Engine, settings: Settings, tenant: str, **config: Any) -> str:
    recorder = Recorder(writer, settings=settings, **config)
    snapshot = RunSnapshot(code_version="sec.1", input={"order": "O-7"})
    run, _ = recorder.record(
        agent, snapshot, agent_id="refunds", tenant_id=tenant, subject_ids=["cust-42"]
    )
    return run.run_id


def _state(engine: Engine) -> tuple[list[Any], list[Any], int]:
    with engine.connect() as conn:
        runs = list(conn.execute(text(ROWS)))
        effects = list(conn.execute(text("SELECT * FROM blackbox.effects ORDER BY run_id")))
        outbox = conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one()
    return runs, effects, outbox


def _forged_finish(engine: Engine, run_id: str, settings: Settings) -> dict[str, Any]:
    """The parameters of a correctly chained plaintext ``run.finished`` for ``run_id``
    (built with the owner's view of the run, as an attacker who read the topic could)."""
    with engine.connect() as conn:
        stored = load_run_txn(conn, run_id, shards=settings.outbox_shards)
    crossing = run_finished(
        status="succeeded", output={"forged": True}, error=None, final_state_digest=None
    )
    event = new_factory(settings, None, utc_now).prepare(
        stored.identity, stored.cursor, crossing, event_id=new_event_id()
    )
    envelope = event.envelope
    return {
        "run_id": run_id,
        "credential": os.urandom(32),
        "shard": stored.identity.shard,
        "sequence": envelope.sequence,
        "chain_hash": envelope.chain_hash,
        "event_id": envelope.event_id,
        "envelope": event.encoded,
        "event_type": str(envelope.event_type),
        "body_version": envelope.body_version,
        "recorded_at": envelope.recorded_at_us,
    }


APPEND = text(
    "SELECT blackbox.append_event(:run_id, :credential, CAST(:shard AS smallint), :sequence, "
    ":chain_hash, 'succeeded', NULL, CAST(:event_id AS uuid), :envelope, NULL, NULL, NULL, "
    "NULL, NULL, :event_type, :body_version, :recorded_at)"
)


@pytest.fixture
def crashed_run_of_a(login: Login, settings: Settings) -> str:
    """A run of tenant A left running (its writer died after one effect)."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    recorder = Recorder(writer, settings=settings)
    run = recorder.start_run(
        RunSnapshot(code_version="sec.1", input={"order": "O-9"}),
        agent_id="refunds",
        tenant_id=TENANT_A,
        subject_ids=["cust-42"],
    )
    run.effect("refund", lambda key: {"id": "R-9"}, arguments={"order": "O-9"}, key="k-9")
    return run.run_id


def test_writer_cannot_update_any_run_or_effect_row(
    login: Login, engine: Engine, settings: Settings, crashed_run_of_a: str
) -> None:
    before = _state(engine)
    for writer in (
        login("blackbox_writer", tenant=TENANT_B),
        login("blackbox_writer", tenant=TENANT_A),
    ):
        for attack in (
            "UPDATE blackbox.runs SET subject_ids = '{}'",
            "UPDATE blackbox.runs SET retention_class = 'forever'",
            "UPDATE blackbox.effects SET status = 'succeeded', external_id = 'forged'",
            "DELETE FROM blackbox.effects",
            "INSERT INTO blackbox.runs (run_id, tenant_id, agent_id, chain_head) "
            "VALUES ('x', 'tenant-a', 'x', 'x')",
            "INSERT INTO blackbox.outbox (shard, run_id, sequence, event_id, envelope) "
            "VALUES (0, 'x', 1, gen_random_uuid(), '\\x00')",
            "INSERT INTO blackbox.data_keys (key_id, run_id, tenant_id, kek_version, wrapped) "
            "VALUES ('k', 'x', 'tenant-b', 'v1', '\\x00')",
        ):
            with (
                writer.connect() as conn,
                pytest.raises(ProgrammingError, match="permission denied"),
            ):
                conn.execute(text(attack))
    assert _state(engine) == before


def test_writer_sees_only_its_tenants_runs(login: Login, crashed_run_of_a: str) -> None:
    writer_b = login("blackbox_writer", tenant=TENANT_B)
    with writer_b.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM blackbox.effects")).scalar_one() == 0
    writer_a = login("blackbox_writer", tenant=TENANT_A)
    with writer_a.connect() as conn:
        assert conn.execute(text("SELECT run_id FROM blackbox.runs")).scalars().all() == [
            crashed_run_of_a
        ]


def test_forged_finish_on_another_writers_run_is_refused(
    login: Login, engine: Engine, settings: Settings, crashed_run_of_a: str
) -> None:
    forged = _forged_finish(engine, crashed_run_of_a, settings)
    before = _state(engine)
    for writer in (
        login("blackbox_writer", tenant=TENANT_B),
        login("blackbox_writer", tenant=TENANT_A),
    ):
        with (
            writer.connect() as conn,
            pytest.raises(ProgrammingError, match="not started by this writer"),
        ):
            conn.execute(APPEND, forged)
    assert _state(engine) == before


def test_credential_of_another_run_does_not_open_this_one(
    login: Login, engine: Engine, settings: Settings, crashed_run_of_a: str
) -> None:
    """A writer's own run's credential does not append to another run."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    own = Recorder(writer, settings=settings).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="other", tenant_id=TENANT_A
    )
    forged = _forged_finish(engine, crashed_run_of_a, settings)
    forged["credential"] = own.core.identity.credential
    with (
        writer.connect() as conn,
        pytest.raises(ProgrammingError, match="not started by this writer"),
    ):
        conn.execute(APPEND, forged)


def test_writer_cannot_start_a_run_for_another_tenant(
    login: Login, engine: Engine, settings: Settings
) -> None:
    writer_a = login("blackbox_writer", tenant=TENANT_A)
    with pytest.raises(WriterRefused, match="may not write runs of tenant 'tenant-b'"):
        _record(writer_a, settings, TENANT_B)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 0


def test_no_event_after_the_end(login: Login, engine: Engine, settings: Settings) -> None:
    """A finished run takes no more events: no forged ``run.redacted`` after a signed head,
    not even from the writer that recorded it."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    recorder = Recorder(writer, settings=settings)
    run = recorder.start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="a", tenant_id=TENANT_A
    )
    run.finish(status="succeeded", output={"ok": True})
    before = _state(engine)
    with pytest.raises(RunNotActive):
        run.now()
    with pytest.raises(RunNotActive, match="takes no more events"):
        recorder.append(
            run.core,
            run_finished(status="failed", output=None, error=None, final_state_digest=None),
            new_event_id(),
            None,
        )
    assert _state(engine) == before


def test_sealed_run_refuses_a_plaintext_body(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """A writer that carries on a sealed run without its keys cannot add clear bodies."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    keys = DataKeyStore(LocalKeyProvider({"v1": os.urandom(32)}))
    run = Recorder(writer, settings=settings, keys=keys).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="a", tenant_id=TENANT_A
    )
    before = _state(engine)
    plain = Recorder(writer, settings=settings).resume(run.run_id)
    with pytest.raises(WriterRefused, match="sealed under a data key"):
        plain.now()
    runs, effects, outbox = _state(engine)
    assert (runs, effects, outbox) == before
    digest = hashlib.sha256(plain.core.identity.credential or b"").digest()
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT credential_hash FROM blackbox.run_writers WHERE run_id = :r"),
            {"r": run.run_id},
        ).scalar_one()
    assert bytes(stored) == digest  # the take-over fenced the first writer out


def test_tenant_granted_by_the_cli_can_be_written(
    login: Login, engine: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    role = writer.url.username
    monkeypatch.setenv("BLACKBOX_DATABASE_URL", settings.database_url)
    with pytest.raises(WriterRefused):
        _record(writer, settings, TENANT_B)
    granted = CliRunner().invoke(main, ["tenants", "grant", str(role), TENANT_B])
    assert granted.exit_code == 0, granted.output
    run_id = _record(writer, settings, TENANT_B)
    listed = CliRunner().invoke(main, ["tenants", "list", "--role", str(role)])
    assert TENANT_B in listed.output
    revoked = CliRunner().invoke(main, ["tenants", "revoke", str(role), TENANT_B])
    assert revoked.exit_code == 0, revoked.output
    with pytest.raises(WriterRefused):
        _record(writer, settings, TENANT_B)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT run_id FROM blackbox.runs")).scalars().all() == [run_id]


def test_readers_see_only_their_granted_tenants(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """Row-level security: the write side's runs and the views, as each reader sees them.
    The relay moves both tenants' events as a relay login (it reads no run)."""
    run_a = _record(login("blackbox_writer", tenant=TENANT_A), settings, TENANT_A)
    run_b = _record(login("blackbox_writer", tenant=TENANT_B), settings, TENANT_B)
    published = Relay(login("blackbox_relay"), settings=settings).drain(timeout=60)
    build_views(settings, engine, expect=published)
    tables = (
        "blackbox.runs",
        "blackbox_views.runs",
        "blackbox_views.events",
        "blackbox_views.integrity_violations",
    )

    def seen(reader: Engine) -> set[str]:
        with reader.connect() as conn:
            return {
                run
                for table in tables
                for run in conn.execute(text(f"SELECT DISTINCT run_id FROM {table}")).scalars()
            }

    assert seen(login("blackbox_reader", tenant=TENANT_A)) == {run_a}
    assert seen(login("blackbox_replayer", tenant=TENANT_B)) == {run_b}
    assert seen(login("blackbox_reader", tenant=EVERY_TENANT)) == {run_a, run_b}
    assert seen(login("blackbox_reader")) == set()


def test_writer_stores_bodies_only_under_their_own_digest(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """Large bodies go out of line through the writer's function, which refuses bytes
    under a digest that is not theirs (a planted blob would replace a later body)."""
    writer = login("blackbox_writer", tenant=TENANT_A)
    run = Recorder(writer, settings=settings).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="a", tenant_id=TENANT_A
    )
    big = noise(2 * settings.blob_threshold_bytes)  # out of line, compressed or not
    assert run.call("echo", lambda text: text, big) == big
    planted = "sha256:" + hashlib.sha256(b"the real body").hexdigest()
    with writer.connect() as conn, pytest.raises(Exception, match="does not match the digest"):
        conn.execute(
            text("SELECT blackbox.store_blob(:t, :d, 'forged')"), {"t": TENANT_A, "d": planted}
        )
    with engine.connect() as conn:
        blobs = conn.execute(text("SELECT digest FROM blackbox.blobs")).scalars().all()
    assert len(blobs) == 1
    assert planted not in blobs


def test_reader_replayer_and_relay_write_nothing(
    login: Login, engine: Engine, settings: Settings, crashed_run_of_a: str
) -> None:
    """Only writers may call the write functions; no other role changes a run either."""
    forged = _forged_finish(engine, crashed_run_of_a, settings)
    before = _state(engine)
    for role in ("blackbox_reader", "blackbox_replayer", "blackbox_relay"):
        other = login(role, tenant=TENANT_A)
        for attack, params in (
            (APPEND, forged),
            (
                text(
                    "SELECT blackbox.start_run('x', 'tenant-a', 'x', '{}', 'x', NULL, NULL, "
                    "'internal', 'standard', sha256('x'))"
                ),
                {},
            ),
            (text("UPDATE blackbox.runs SET status = 'succeeded'"), {}),
        ):
            with (
                other.connect() as conn,
                pytest.raises(ProgrammingError, match="permission denied"),
            ):
                conn.execute(attack, params)
    assert _state(engine) == before


def test_own_credential_does_not_carry_another_runs_envelope(
    login: Login, engine: Engine, settings: Settings, crashed_run_of_a: str
) -> None:
    """The outbox row is its run's: an envelope naming another run (or tenant, sequence or
    event id) is refused even under a valid credential, so the relay never publishes it
    under this run's key."""
    writer = login("blackbox_writer", tenant=TENANT_B)
    own = Recorder(writer, settings=settings).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="b", tenant_id=TENANT_B
    )
    forged = _forged_finish(engine, crashed_run_of_a, settings)  # names tenant A's run
    with engine.connect() as conn:
        head = load_run_txn(conn, own.run_id, shards=settings.outbox_shards)
    smuggled = {
        **forged,
        "run_id": own.run_id,
        "credential": own.core.identity.credential,
        "shard": head.identity.shard,
        "sequence": head.cursor.sequence + 1,
    }
    before = _state(engine)
    for params in (smuggled, {**smuggled, "event_id": str(uuid.uuid4())}):
        refused = pytest.raises(ProgrammingError, match="does not carry that run")
        with writer.connect() as conn, refused:
            conn.execute(APPEND, params)
    assert _state(engine) == before
    own.now()  # the run itself carries on


def test_another_login_cannot_take_over_a_live_run(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """A take-over is for crashed runs: another login of the same tenant is refused while
    the run is recent (its writer may be alive); the same login (a restarted process)
    may at once; once the run was quiet long enough, another login may too."""
    first_login = login("blackbox_writer", tenant=TENANT_A)
    other_login = login("blackbox_writer", tenant=TENANT_A)
    live = Recorder(first_login, settings=settings).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="a", tenant_id=TENANT_A
    )
    with pytest.raises(ConcurrentRunWriter, match="may still be recording"):
        Recorder(other_login, settings=settings).resume(live.run_id)
    live.now()  # the live writer was not fenced out
    restarted = Recorder(first_login, settings=settings).resume(live.run_id)
    restarted.now()
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE blackbox.runs SET updated_at = now() - interval '11 minutes'"),
        )
    taken = Recorder(other_login, settings=settings).resume(live.run_id)
    taken.now()
    with pytest.raises(WriterRefused):
        restarted.now()


def test_a_grant_of_a_missing_or_dropped_role_breaks_no_reader(
    login: Login, engine: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLACKBOX_DATABASE_URL", settings.database_url)
    typo = CliRunner().invoke(main, ["tenants", "grant", "no_such_role", TENANT_A])
    assert typo.exit_code == 2
    assert "there is no role 'no_such_role'" in typo.output
    with engine.begin() as conn:
        conn.execute(text("CREATE ROLE doomed_role NOLOGIN"))
        grant_tenant_txn(conn, "doomed_role", TENANT_A)
        conn.execute(text("DROP ROLE doomed_role"))
    run_id = _record(login("blackbox_writer", tenant=TENANT_A), settings, TENANT_A)
    reader = login("blackbox_reader", tenant=TENANT_A)
    with reader.connect() as conn:
        assert conn.execute(text("SELECT run_id FROM blackbox.runs")).scalars().all() == [run_id]
    # A role created again under the dropped one's name is another role: no grant.
    with engine.begin() as conn:
        conn.execute(text("CREATE ROLE doomed_role LOGIN IN ROLE blackbox_reader"))
    reborn = create_engine(make_url(settings.database_url).set(username="doomed_role"))
    try:
        with reborn.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 0
    finally:
        reborn.dispose()
        with engine.begin() as conn:
            conn.execute(text("DROP ROLE doomed_role"))
