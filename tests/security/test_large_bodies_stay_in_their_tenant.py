"""Bodies stored out of line (``blackbox.blobs``) are read only by their tenant's replayers.

Attacks: a replayer granted tenant B reads tenant A's large body by its digest (digests
travel in every envelope, so knowing one is no secret); a writer of tenant A stores a
body as tenant B's, or as nobody's; a reader (who may not open bodies at all) reads the
table. And a database from before bodies had tenants: its bodies are nobody's until
``blackbox migrate`` gives each to the tenant of the runs that name it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from agent_blackbox.cli import main
from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.outbox import DatabaseUnavailable, Recorder, RunSnapshot
from agent_blackbox.outbox.lifecycle import delete_run_metadata_txn
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import EVERY_TENANT, PostgresBlobs, migrate_write_side
from agent_blackbox.replayer import KafkaRunSource
from agent_blackbox.schemas import PermissionRefused, Settings
from tests.conftest import Login
from tests.integration._agents import noise
from tests.integration._backups import AGENTS, large_entry
from tests.integration._views import build_views
from tests.security._forging import produce_to
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

_OWNERS = text("SELECT digest, tenant_id FROM blackbox.blobs ORDER BY digest, tenant_id")
_STORE = text("SELECT blackbox.store_blob(:tenant, :digest, :data)")


def _record_large(writer: Engine, settings: Settings, tenant: str, *, seed: int) -> str:
    """A run of ``tenant`` with one body out of line; its run id."""
    run = Recorder(writer, settings=settings).start_run(
        RunSnapshot(code_version="sec.1", input={}), agent_id="a", tenant_id=tenant
    )
    big = noise(2 * settings.blob_threshold_bytes, seed=seed)
    assert run.call("echo", lambda value: value, big) == big
    run.finish(output={"ok": True})
    return run.run_id


def _owners(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [(str(d), str(t)) for d, t in conn.execute(_OWNERS)]


def test_a_replayer_reads_its_tenants_bodies_and_no_other(
    login: Login, engine: Engine, settings: Settings
) -> None:
    _record_large(login("blackbox_writer", tenant=TENANT_A), settings, TENANT_A, seed=1)
    _record_large(login("blackbox_writer", tenant=TENANT_B), settings, TENANT_B, seed=2)
    owners = dict((tenant, digest) for digest, tenant in _owners(engine))
    assert set(owners) == {TENANT_A, TENANT_B}, "each run's body is stored as its tenant's"
    body_a, body_b = owners[TENANT_A], owners[TENANT_B]

    replayer_b = PostgresBlobs(login("blackbox_replayer", tenant=TENANT_B))
    assert replayer_b.read(body_b)
    with pytest.raises(DatabaseUnavailable, match="granted"):
        replayer_b.read(body_a)
    # No plan over the table either: an EXPLAIN ANALYZE's "rows removed by filter" would
    # count the rows row security hides, and so list other tenants' digests.
    planner = login("blackbox_replayer", tenant=TENANT_B)
    with planner.connect() as conn, pytest.raises(DBAPIError, match="permission denied"):
        conn.execute(text("EXPLAIN ANALYZE SELECT 1 FROM blackbox.blobs"))

    everyone = PostgresBlobs(login("blackbox_replayer", tenant=EVERY_TENANT))
    assert everyone.read(body_a)
    assert everyone.read(body_b)
    ungranted = PostgresBlobs(login("blackbox_replayer"))
    with pytest.raises(DatabaseUnavailable):
        ungranted.read(body_a)
    reader = login("blackbox_reader", tenant=TENANT_A)
    with reader.connect() as conn, pytest.raises(DBAPIError, match="permission denied"):
        conn.execute(text("SELECT data FROM blackbox.blobs"))


def test_the_same_bytes_stored_by_two_tenants_are_two_rows(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """Content addressing does not share a body across tenants: tenant B storing bytes
    tenant A stored does not let A's replayer read B's copy or B's read A's."""
    data = b"the same large body"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    for tenant in (TENANT_A, TENANT_B):
        with login("blackbox_writer", tenant=tenant).begin() as conn:
            conn.execute(_STORE, {"tenant": tenant, "digest": digest, "data": data})
    assert _owners(engine) == [(digest, TENANT_A), (digest, TENANT_B)]
    replayer_a = PostgresBlobs(login("blackbox_replayer", tenant=TENANT_A))
    assert replayer_a.read(digest) == data
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM blackbox.blobs WHERE tenant_id = :t"), {"t": TENANT_A})
    with pytest.raises(DatabaseUnavailable, match="granted"):
        replayer_a.read(digest)  # B's copy of the same bytes is B's


def test_an_agent_of_an_older_release_is_told_to_upgrade(login: Login, engine: Engine) -> None:
    writer = login("blackbox_writer", tenant=TENANT_A)
    data = b"a large body"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    old_call = text("SELECT blackbox.store_blob(:digest, :data)")
    with writer.begin() as conn, pytest.raises(DBAPIError, match="upgrade agent-blackbox"):
        conn.execute(old_call, {"digest": digest, "data": data})
    assert _owners(engine) == []


@pytest.mark.parametrize("claimed", [TENANT_B, "", EVERY_TENANT])
def test_a_writer_stores_bodies_for_its_own_tenants_only(
    login: Login, engine: Engine, claimed: str
) -> None:
    data = b"planted for another tenant"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    writer = login("blackbox_writer", tenant=TENANT_A)
    with writer.begin() as conn, pytest.raises(DBAPIError, match="may not store bodies"):
        conn.execute(_STORE, {"tenant": claimed, "digest": digest, "data": data})
    assert _owners(engine) == []


def test_bodies_stored_before_they_had_tenants_are_attributed_by_migrate(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """A database from before this revision: its bodies are nobody's (the owner reads
    them, no replayer does, not even one granted every tenant) until ``blackbox
    migrate`` gives a copy to the tenants of the runs whose events name it, and only on
    proof: events read from the topic that chain from the run's first event to the head
    the write side held for it at the upgrade (neither an event appended since nor a
    forged copy beside a real one is on that chain)."""
    writer_a = login("blackbox_writer", tenant=TENANT_A)
    _record_large(writer_a, settings, TENANT_A, seed=3)
    orphan = b"a body no indexed event names"
    with writer_a.begin() as conn:
        orphan_digest = "sha256:" + hashlib.sha256(orphan).hexdigest()
        conn.execute(_STORE, {"tenant": TENANT_A, "digest": orphan_digest, "data": orphan})
    # A run of tenant B that goes on after the upgrade.
    going_on = Recorder(login("blackbox_writer", tenant=TENANT_B), settings=settings)
    run_b = going_on.start_run(RunSnapshot("sec.1", {}), agent_id="b", tenant_id=TENANT_B)
    run_b.call("echo", lambda value: value, "before the upgrade")  # sequence 2
    relay = Relay(login("blackbox_relay"), settings=settings)
    published = relay.drain(timeout=60)
    build_views(settings, engine, expect=published)
    (body_a, _), _ = sorted(_owners(engine), key=lambda row: row[0] == orphan_digest)

    _migrate_write_side_to(engine, "0011")  # as it was: one row per digest, no tenant
    migrate_write_side(engine)
    assert {tenant for _, tenant in _owners(engine)} == {""}
    replayer_a = PostgresBlobs(login("blackbox_replayer", tenant=TENANT_A))
    everyone = PostgresBlobs(login("blackbox_replayer", tenant=EVERY_TENANT))
    for reader in (replayer_a, everyone):
        with pytest.raises(PermissionRefused, match="blackbox migrate"):
            reader.read(body_a)
    assert PostgresBlobs(engine).read(body_a), "the owner reads a body nobody owns"

    # Whoever may produce to the topic writes a copy of B's event 2 (within the head B's
    # run had at the upgrade) that names A's body, its chain hash consistent with event 1.
    index = ViewRunIndex.from_settings(engine, settings)
    source = KafkaRunSource(settings, index, run_b.run_id)
    started, echoed = list(source)[:2]
    forged = replace(echoed, payload=None, payload_ref=body_a, chain_hash="")
    produce_to(settings, forged.linked(started.chain_hash), source.partition)
    # B's run goes on: a large body of its own at sequence 3, whose indexed event names
    # A's body instead (as if its writer had learned A's digest and named it).
    big = noise(2 * settings.blob_threshold_bytes, seed=5)
    run_b.call("echo", lambda value: value, big)  # sequence 3
    run_b.finish(output={})
    published += relay.drain(timeout=60)
    build_views(settings, engine, expect=published)
    _views(
        engine, "SET payload_ref = :ref WHERE run_id = :run AND sequence = 3", body_a, run_b.run_id
    )

    said = _migrate(settings)
    assert "could not be read" not in said
    assert "1 copy given" in said
    assert "1 no tenant has yet stay readable by the owner only" in said
    owners = [row for row in _owners(engine) if row[0] in (body_a, orphan_digest)]
    assert owners == sorted([(body_a, ""), (body_a, TENANT_A), (orphan_digest, "")]), (
        "A's body is A's (and the owner keeps its copy); B's forged and late references "
        "claim nothing; the body no event names stays the owner's"
    )
    assert replayer_a.read(body_a)
    with pytest.raises(DatabaseUnavailable, match="granted"):
        PostgresBlobs(login("blackbox_replayer", tenant=TENANT_B)).read(body_a)
    assert "0 copies given" in _migrate(settings), "again: nothing more"
    relay.close()
    # The head kept for B's run goes with it (retention): a later run given its id is
    # another run, and may claim nothing by it.
    heads = text("SELECT count(*) FROM blackbox.blob_tenancy_heads WHERE run_id = :run")
    with engine.begin() as conn:
        assert conn.execute(heads, {"run": run_b.run_id}).scalar_one() == 1
        delete_run_metadata_txn(conn, [run_b.run_id])
        assert conn.execute(heads, {"run": run_b.run_id}).scalar_one() == 0


def _views(engine: Engine, change: str, ref: str | None, run: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE blackbox_views.events {change}"), {"ref": ref, "run": run})


def _migrate(settings: Settings) -> str:
    # The topic is the index's; the broker is the test's (migrate reads runs from it).
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
    }
    result = CliRunner().invoke(main, ["migrate"], env=env)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_body_the_login_may_not_read_is_a_setup_error_not_a_finding(
    login: Login, engine: Engine, settings: Settings
) -> None:
    """Replay as a replayer whose run's body is still the owner's: an ERROR naming what
    to do (exit 2), not a divergence; verify as a reader (who reads no bodies): the
    body is unchecked and said to be, not reported as tampered."""
    run, _ = Recorder(engine, settings=settings).record(
        large_entry,
        RunSnapshot(code_version="sec.1", input={"q": "weather"}),
        agent_id="backup-large",
    )
    published = Relay(login("blackbox_relay"), settings=settings).drain(timeout=60)
    build_views(settings, engine, expect=published)
    with engine.begin() as conn:
        conn.execute(text("UPDATE blackbox.blobs SET tenant_id = ''"))

    def cli(who: Engine, *args: str) -> Result:
        env = {
            "BLACKBOX_DATABASE_URL": who.url.render_as_string(hide_password=False),
            "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "BLACKBOX_TOPIC": settings.topic,
            "BLACKBOX_AGENTS": AGENTS,
            "BLACKBOX_PURPOSE": "security test of out-of-line bodies",
            "BLACKBOX_KEK": None,
            "BLACKBOX_KEK_FILE": None,
        }
        return CliRunner(env=env).invoke(main, list(args))

    replayer = login("blackbox_replayer", tenant="default")
    replayed = cli(replayer, "replay", run.run_id, "--json")
    assert replayed.exit_code == 2, replayed.output
    [line] = [json.loads(row) for row in replayed.stdout.splitlines() if '"result"' in row]
    assert line["result"] == "ERROR", line
    assert "stored before bodies had tenants" in line["error"]

    verified = cli(login("blackbox_reader", tenant="default"), "verify", run.run_id)
    assert verified.exit_code == 0, verified.output
    assert "1 body stored out of line was not checked" in " ".join(verified.output.split())
    with engine.begin() as conn:
        conn.execute(text("UPDATE blackbox.blobs SET tenant_id = 'default'"))
    assert cli(replayer, "replay", run.run_id).exit_code == 0
    timeline = cli(replayer, "timeline", run.run_id, "--bodies")
    assert timeline.exit_code == 0, timeline.output
    assert "(out of line" not in timeline.output, "the granted replayer sees the body"
    as_writer = cli(login("blackbox_writer", tenant="default"), "replay", run.run_id)
    assert as_writer.exit_code == 2
    assert "blackbox_reader or blackbox_replayer login" in " ".join(as_writer.output.split())
    assert "Check that Postgres runs" not in as_writer.output


def _migrate_write_side_to(engine: Engine, revision: str) -> None:
    import agent_blackbox.outbox as outbox

    config = Config()
    config.set_main_option("script_location", str(Path(outbox.__file__).parent / "migrations"))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
