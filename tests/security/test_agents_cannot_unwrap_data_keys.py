"""Finding 9: keys were shared and symmetric.

Agents held the key-encryption key, so any agent host could unwrap every data key of any
backup, and the writer role read every tenant's ``tenant_keys``. Now an agent host holds
only the public half of a key pair (``BLACKBOX_KEK_PUBLIC_FILE``): it wraps new data keys
and unwraps none, from the database or from a copy of it; only the replayer's private
half opens them, through the audited functions.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from agent_blackbox.cli.main import main
from agent_blackbox.keystore import (
    SEALED_ENCODING,
    DataKeyStore,
    KeystoreError,
    LocalKeyProvider,
    PublicKeyProvider,
    WrapOnly,
    WrappedKey,
    tenant_aad,
    wrapping_aad,
)
from agent_blackbox.outbox import AgentRun, AsyncRecorder, Recorder, RunSnapshot
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import Settings, split_encoding
from tests.conftest import Login
from tests.security._keys import envelopes, key_pair_files, replaying, table
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

SECRET = "the-recorded-secret-91c2"
SNAPSHOT = RunSnapshot(code_version="keys.9", input={"customer": "c-7"})
KEY_TABLES = "SELECT tenant_id, kek_version, wrapped FROM blackbox.tenant_keys"


def agent(run: AgentRun, input: Any) -> Any:
    note = run.call("lookup", lambda customer: {"note": f"{SECRET} {customer}"}, input["customer"])
    return {"reply": note["note"]}


def _record(writer: Engine, settings: Settings, keys: DataKeyStore, tenant: str) -> str:
    recorder = Recorder(writer, settings=settings, keys=keys)
    run, _ = recorder.record(agent, SNAPSHOT, agent_id="keys-9", tenant_id=tenant)
    return run.run_id


def test_an_agent_host_unwraps_no_data_key_from_the_database_or_a_copy(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path
) -> None:
    private, public = key_pair_files(tmp_path)
    agent_keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    assert agent_keys is not None
    runs = {
        tenant: _record(login("blackbox_writer", tenant=tenant), settings, agent_keys, tenant)
        for tenant in (TENANT_A, TENANT_B)
    }
    # From the database, as the agent's role: no key table answers.
    writer = login("blackbox_writer", tenant=TENANT_A)
    for query in (
        "SELECT wrapped FROM blackbox.data_keys",
        "SELECT wrapped FROM blackbox.tenant_keys",
        "SELECT secret FROM blackbox.tenant_digest_keys",
    ):
        with writer.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text(query))
    # From a copy of the database (what a backup holds): every data key and every
    # tenant's wrapped digest key, and the agent host's provider opens none of them.
    data_keys = table(engine, "SELECT run_id, key_id, kek_version, wrapped FROM blackbox.data_keys")
    tenant_keys = table(engine, KEY_TABLES)
    assert {run_id for run_id, *_ in data_keys} == set(runs.values())
    assert {tenant for tenant, *_ in tenant_keys} == {TENANT_A, TENANT_B}
    for run_id, key_id, version, blob in data_keys:
        with pytest.raises(WrapOnly, match="unwraps none"):
            agent_keys.provider.unwrap(
                WrappedKey(version, bytes(blob)), aad=wrapping_aad(run_id, key_id)
            )
    for tenant, version, blob in tenant_keys:
        with pytest.raises(WrapOnly):
            agent_keys.provider.unwrap(WrappedKey(version, bytes(blob)), aad=tenant_aad(tenant))
    # Nothing secret is on the agent host: the public file holds no private half.
    assert private.read_text().split('"x25519": "')[1].split('"')[0] not in public.read_text()
    # The replayer, holding the private half and granted tenant A, reads tenant A's run.
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    events = envelopes(engine, runs[TENANT_A])
    report = replay_run(events, agent, **replaying(replayer, private, "finding 9 check"))
    assert report.passed, report.divergence and report.divergence.describe()
    # ... and not tenant B's: its keys are refused to a replayer of tenant A.
    other = replay_run(
        envelopes(engine, runs[TENANT_B]), agent, **replaying(replayer, private, "finding 9")
    )
    assert other.result == "ERROR"
    assert other.error is not None
    assert other.error.startswith("AccessDenied: ")


def test_a_tenant_a_writer_reads_and_changes_no_tenant_key(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path
) -> None:
    _, public = key_pair_files(tmp_path)
    agent_keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    assert agent_keys is not None
    _record(login("blackbox_writer", tenant=TENANT_B), settings, agent_keys, TENANT_B)
    before = table(engine, KEY_TABLES), table(engine, "TABLE blackbox.tenant_digest_keys")
    writer_a = login("blackbox_writer", tenant=TENANT_A)
    for statement in (
        "SELECT * FROM blackbox.tenant_keys",
        "SELECT count(*) FROM blackbox.tenant_keys",
        f"UPDATE blackbox.tenant_keys SET wrapped = ''::bytea WHERE tenant_id = '{TENANT_B}'",
        f"DELETE FROM blackbox.tenant_keys WHERE tenant_id = '{TENANT_B}'",
        "INSERT INTO blackbox.tenant_keys (tenant_id, kek_version, wrapped) "
        "VALUES ('tenant-c', 'v1', ''::bytea)",
        "SELECT * FROM blackbox.tenant_digest_keys",
    ):
        with writer_a.begin() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text(statement))
    assert (table(engine, KEY_TABLES), table(engine, "TABLE blackbox.tenant_digest_keys")) == (
        before
    )


def test_a_symmetric_deployment_rotates_to_wrap_only_agents(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path
) -> None:
    """An existing deployment (symmetric KEK v1, digest keys made by an earlier release)
    adds a key pair version, rotates, and from then on gives agents the public half."""
    private = tmp_path / "kek.json"
    assert CliRunner().invoke(main, ["keys", "init", str(private)]).exit_code == 0
    legacy = LocalKeyProvider.from_file(private)
    # A digest key as the earlier release stored it: wrapped under v1, no raw copy.
    secret = bytes(range(32))
    wrapped = legacy.wrap(secret, aad=tenant_aad(TENANT_A))
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO blackbox.tenant_keys VALUES (:t, :v, :w)"),
            {"t": TENANT_A, "v": wrapped.kek_version, "w": wrapped.blob},
        )
    writer = login("blackbox_writer", tenant=TENANT_A)
    old_run = _record(writer, settings, DataKeyStore(legacy), TENANT_A)  # agents as they were
    _, public = key_pair_files(tmp_path, "--add", "--version", "v2")
    agent_keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    assert agent_keys is not None
    with pytest.raises(KeystoreError, match="keys rotate"):
        _record(writer, settings, agent_keys, TENANT_A)

    env = {"BLACKBOX_KEK_FILE": str(private), "BLACKBOX_DATABASE_URL": settings.database_url}
    rotated = CliRunner(env=env).invoke(main, ["keys", "rotate"])
    assert rotated.exit_code == 0, rotated.output
    assert "2 keys re-wrapped under KEK version v2" in rotated.output
    assert table(engine, "SELECT DISTINCT kek_version FROM blackbox.data_keys") == [("v2",)]
    assert table(engine, "SELECT tenant_id, secret FROM blackbox.tenant_digest_keys") == [
        (TENANT_A, secret)
    ]
    new_run = _record(writer, settings, agent_keys, TENANT_A)  # wrap-only from now on
    old, new = envelopes(engine, old_run), envelopes(engine, new_run)
    assert old[0].input_digest == new[0].input_digest  # one digest key, before and after
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    for events in (old, new):
        report = replay_run(events, agent, **replaying(replayer, private, "after rotation"))
        assert report.passed, report.divergence and report.divergence.describe()


def test_recorders_built_from_an_agent_hosts_settings_are_wrap_only(
    engine: Engine,
    settings: Settings,
    login: Login,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    private, public = key_pair_files(tmp_path)
    monkeypatch.delenv("BLACKBOX_KEK", raising=False)
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    monkeypatch.setenv("BLACKBOX_KEK_PUBLIC_FILE", str(public))
    writer = login("blackbox_writer", tenant=TENANT_A)
    as_writer = replace(settings, database_url=writer.url.render_as_string(hide_password=False))
    recorder = Recorder.from_settings(as_writer)
    async_recorder = AsyncRecorder.from_settings(as_writer)
    try:
        for built in (recorder, async_recorder):
            assert built.keys is not None
            assert isinstance(built.keys.provider, PublicKeyProvider)
        run, _ = recorder.record(agent, SNAPSHOT, agent_id="keys-9", tenant_id=TENANT_A)
    finally:
        recorder.engine.dispose()
        asyncio.run(async_recorder.engine.dispose())
    events = envelopes(engine, run.run_id)
    assert {split_encoding(e.payload_encoding)[1] for e in events} == {SEALED_ENCODING}
    assert all(e.output_digest.startswith("hmac-sha256:") for e in events)
    replayer = login("blackbox_replayer", tenant=TENANT_A)
    report = replay_run(events, agent, **replaying(replayer, private, "finding 9 settings"))
    assert report.passed, report.divergence and report.divergence.describe()
