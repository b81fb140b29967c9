"""Envelope encryption and access control against a real Postgres.

Runs are recorded encrypted; then the test connects as each database role (login users
granted blackbox_writer, blackbox_reader, blackbox_replayer and blackbox_relay) and proves
what each may and may not reach.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from agent_blackbox.keystore import (
    SEALED_ENCODING,
    AccessDenied,
    AesGcmSealer,
    AuditedKeys,
    DataKeyMissing,
    DataKeyStore,
    KeystoreError,
    LocalKeyProvider,
    UnknownKeyVersion,
    WrongKey,
)
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.outbox.storage import EVERY_TENANT
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import (
    Envelope,
    PayloadPipeline,
    Settings,
    digest,
    split_encoding,
)
from tests.integration._kafka import read_topic
from tests.integration._outbox import outbox_envelopes

pytestmark = pytest.mark.integration

SECRET = "the-recorded-secret-7d1f"


def _kek() -> bytes:
    return os.urandom(32)


def agent(run: AgentRun, input: Any) -> Any:
    note = run.call("lookup", lambda ticket: {"note": f"{SECRET} for {ticket}"}, input["ticket"])
    run.transition("answered", state={"note": note["note"]})
    return {"reply": note["note"].upper()}


def _record(engine: Engine, settings: Settings, provider: LocalKeyProvider) -> str:
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(provider))
    snapshot = RunSnapshot(code_version="keys.1", input={"ticket": "T-1"})
    run, _ = recorder.record(agent, snapshot, agent_id="keys")
    return run.run_id


def _envelopes(engine: Engine, run_id: str) -> list[Envelope]:
    return outbox_envelopes(engine, run_id)


def _denied(engine: Engine, *queries: str) -> None:
    """Each query, run alone, is refused for want of a privilege."""
    for query in queries:
        with engine.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text(query))


V1 = os.urandom(32)


@pytest.fixture
def provider() -> LocalKeyProvider:
    return LocalKeyProvider({"v1": V1})


@pytest.fixture
def login(login: Any) -> Any:
    """Login users of a role, granted every tenant."""
    return lambda role: login(role, tenant=EVERY_TENANT)


def test_encrypted_run_stores_no_plaintext_body(
    engine: Engine, settings: Settings, provider: LocalKeyProvider
) -> None:
    run_id = _record(engine, settings, provider)
    events = _envelopes(engine, run_id)
    assert {split_encoding(e.payload_encoding)[1] for e in events} == {SEALED_ENCODING}
    assert len({e.key_id for e in events}) == 1
    with engine.connect() as conn:
        stored = b"".join(conn.execute(text("SELECT envelope FROM blackbox.outbox")).scalars())
        keys = conn.execute(
            text("SELECT kek_version, wrapped FROM blackbox.data_keys WHERE run_id = :r"),
            {"r": run_id},
        ).all()
    assert SECRET.encode() not in stored
    assert [(version, len(wrapped)) for version, wrapped in keys] == [("v1", 12 + 32 + 16)]


def test_reader_cannot_obtain_a_body_or_a_key(
    engine: Engine, settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    run_id = _record(engine, settings, provider)
    reader = login("blackbox_reader")
    with reader.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM blackbox.runs")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM blackbox_views.runs")).scalar_one() == 0
    _denied(
        reader,
        "SELECT envelope FROM blackbox.outbox",
        "SELECT data FROM blackbox.blobs",
        "SELECT wrapped FROM blackbox.data_keys",
        "SELECT * FROM blackbox.access_audit",
        f"SELECT blackbox.request_key_access('curious', '{run_id}')",
        f"SELECT * FROM blackbox.unwrap_data_key('{run_id}', 'dk', 1)",
    )
    keys = AuditedKeys(reader, provider, purpose="peek")
    events = _envelopes(engine, run_id)
    # Access refused is the replay's error, never a divergence, and names what it wanted.
    report = replay_run(
        events, agent, pipeline=PayloadPipeline(sealer=AesGcmSealer(keys)), digests=keys
    )
    assert report.result == "ERROR"
    assert report.error is not None
    assert report.error.startswith("AccessDenied: tenant default digest key")
    with pytest.raises(AccessDenied, match=f"run {run_id} key dk-"):
        keys.opening_key(run_id, str(events[1].key_id))


def test_writer_records_but_reads_no_key_back(
    settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    writer = login("blackbox_writer")
    run_id = _record(writer, settings, provider)
    with writer.connect() as conn:
        assert (
            conn.execute(
                text("SELECT last_sequence FROM blackbox.runs WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
            == 4
        )
        with pytest.raises(ProgrammingError, match="permission denied"):
            conn.execute(text("SELECT wrapped FROM blackbox.data_keys"))


def test_relay_moves_the_outbox_and_reads_nothing_else(
    engine: Engine, settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    run_id = _record(engine, settings, provider)
    recorded = _envelopes(engine, run_id)
    as_relay = login("blackbox_relay")
    relay = Relay(as_relay, settings=settings)
    try:
        assert relay.drain(timeout=60) == len(recorded)
    finally:
        relay.close()
    published = read_topic(settings.kafka_bootstrap, settings.topic, expect=len(recorded))
    assert [envelope for _, _, envelope in published] == recorded  # sealed, as recorded
    assert _envelopes(engine, run_id) == []
    _denied(
        as_relay,
        "SELECT * FROM blackbox.runs",
        "SELECT data FROM blackbox.blobs",
        "SELECT wrapped FROM blackbox.data_keys",
        "SELECT wrapped FROM blackbox.tenant_keys",
        "SELECT * FROM blackbox.access_audit",
        "UPDATE blackbox.outbox SET envelope = ''::bytea",
        f"SELECT blackbox.request_key_access('curious', '{run_id}')",
        f"SELECT * FROM blackbox.unwrap_data_key('{run_id}', 'dk', 1)",
    )


def test_every_unwrap_is_audited_and_the_run_replays(
    engine: Engine, settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    run_id = _record(engine, settings, provider)
    replayer = login("blackbox_replayer")
    events = _envelopes(engine, run_id)
    for attempt in range(2):
        keys = AuditedKeys(replayer, provider, purpose=f"incident 4411 #{attempt}")
        pipeline = PayloadPipeline(sealer=AesGcmSealer(keys))
        report = replay_run(events, agent, pipeline=pipeline, digests=keys)
        assert report.passed, report.divergence and report.divergence.describe()
    with engine.connect() as conn:
        audit = conn.execute(
            text(
                "SELECT principal, purpose, run_id, tenant_id, key_id, outcome "
                "FROM blackbox.access_audit WHERE principal <> current_user ORDER BY id"
            )
        ).all()
    user, key_id = replayer.url.username, events[0].key_id
    assert audit == [
        row
        for i in range(2)
        for row in [
            (user, f"incident 4411 #{i}", None, "default", None, "requested"),
            (user, f"incident 4411 #{i}", None, "default", None, "digest key"),
            (user, f"incident 4411 #{i}", run_id, "default", None, "requested"),
            (user, f"incident 4411 #{i}", run_id, "default", key_id, "granted"),
        ]
    ]
    with pytest.raises(AccessDenied, match="purpose"):
        AuditedKeys(replayer, provider, purpose=" ")


def test_key_errors_name_the_run_and_the_key(
    engine: Engine, settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    run_id = _record(engine, settings, provider)
    replayer = login("blackbox_replayer")
    body = _envelopes(engine, run_id)[1]
    where = f"run {run_id} key {body.key_id}"

    def open_with(keys_provider: LocalKeyProvider) -> None:
        keys = AuditedKeys(replayer, keys_provider, purpose="errors test")
        PayloadPipeline(sealer=AesGcmSealer(keys)).unpack(body)

    with pytest.raises(WrongKey, match=where):
        open_with(LocalKeyProvider({"v1": _kek()}))
    with pytest.raises(UnknownKeyVersion, match=f"{where}.*KEK version v1 is not held"):
        open_with(LocalKeyProvider({"v9": _kek()}))
    with engine.begin() as conn:
        conn.execute(text("UPDATE blackbox.data_keys SET wrapped = NULL, destroyed_at = now()"))
    with pytest.raises(DataKeyMissing, match=f"{where}.*destroyed"):
        open_with(provider)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM blackbox.data_keys"))
    with pytest.raises(DataKeyMissing, match=f"{where}: no such data key"):
        open_with(provider)


def test_rotation_rewraps_keys_and_leaves_events_alone(
    engine: Engine, settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    run_id = _record(engine, settings, provider)
    before = _envelopes(engine, run_id)
    v2 = _kek()
    rotated = LocalKeyProvider({"v1": V1, "v2": v2}, current="v2")
    assert DataKeyStore(rotated).rotate(engine) == 2  # the run's data key, the digest key
    assert DataKeyStore(rotated).rotate(engine) == 0  # nothing left under v1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kek_version FROM blackbox.data_keys")).scalars().all() == [
            "v2"
        ]
    assert _envelopes(engine, run_id) == before
    only_v2 = LocalKeyProvider({"v2": v2})
    keys = AuditedKeys(login("blackbox_replayer"), only_v2, purpose="after rotation")
    opened = PayloadPipeline(sealer=AesGcmSealer(keys))
    report = replay_run(before, agent, pipeline=opened, digests=keys)
    assert report.passed, report.divergence and report.divergence.describe()


def test_sensitive_runs_take_keyed_digests_and_replay_through_audited_tenant_keys(
    engine: Engine, settings: Settings, provider: LocalKeyProvider, login: Any
) -> None:
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(provider))
    snapshot = RunSnapshot(code_version="keys.1", input={"ticket": "T-1"})
    run, _ = recorder.record(agent, snapshot, agent_id="keys", classification="sensitive")
    events = _envelopes(engine, run.run_id)
    assert all(e.input_digest.startswith("hmac-sha256:") for e in events)
    assert all(e.output_digest.startswith("hmac-sha256:") for e in events)
    # A guess hashed without the tenant's key does not find the recorded digest.
    assert digest({"result": {"note": f"{SECRET} for T-1"}, "error": None}) not in {
        e.output_digest for e in events
    }
    replayer = login("blackbox_replayer")
    keys = AuditedKeys(replayer, provider, purpose="sensitive replay")
    opened = PayloadPipeline(sealer=AesGcmSealer(keys))
    report = replay_run(events, agent, pipeline=opened, digests=keys)
    assert report.passed, report.divergence and report.divergence.describe()
    unkeyed = replay_run(events, agent, pipeline=opened)
    assert unkeyed.result == "ERROR"
    assert unkeyed.error is not None
    assert f"run {run.run_id} of tenant default" in unkeyed.error
    with engine.connect() as conn:
        outcomes = conn.execute(
            text(
                "SELECT run_id IS NULL, tenant_id, outcome FROM blackbox.access_audit "
                "WHERE key_id IS NULL ORDER BY id"
            )
        ).all()
    assert outcomes == [
        (True, "default", "digest key to writer"),
        (True, "default", "requested"),
        (True, "default", "digest key"),
        (False, "default", "requested"),
    ]
    with pytest.raises(KeystoreError, match="take keyed digests"):
        Recorder(engine, settings=settings).start_run(
            snapshot, agent_id="keys", classification="sensitive"
        )
