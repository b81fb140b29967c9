"""Finding 8: plain SHA-256 digests of low-entropy values confirmed guesses.

A customer id, a tool's yes/no or tier, a ``randint`` value: hashing every candidate and
looking for it among a run's digests (in the topic, or in ``blackbox_views.events``,
which the reader role reads) told which one was recorded. Every run of a recorder with
keys now takes HMAC digests under its tenant's key, and a writer of another tenant
cannot obtain that key.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from agent_blackbox.keystore import AccessDenied, DataKeyStore
from agent_blackbox.outbox import AgentRun, MemoryRecorder, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import Envelope, Settings
from tests.conftest import Login
from tests.integration._kafka import read_topic
from tests.integration._views import build_views
from tests.security._keys import envelopes, key_pair_files, replaying, table
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

CUSTOMERS = [f"customer-{n}" for n in range(1, 31)]
TIERS = range(1, 6)
ROLLS = range(1, 7)
DIGEST_TABLES = "SELECT tenant_id, secret FROM blackbox.tenant_digest_keys"


def agent(run: AgentRun, input: Any) -> Any:
    tier = run.call("tier", lambda customer: input["tier"], input["customer"])
    roll = run.randint(1, 6)
    return {"tier": tier, "roll": roll}


def _digests(events: list[Envelope]) -> set[str]:
    return {d for e in events for d in (e.input_digest, e.output_digest)}


def _dictionary(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The attacker's table: the plain digests of every candidate customer, tier and
    roll, made by recording the same agent without keys."""
    guesses: set[str] = set()
    for n, customer in enumerate(CUSTOMERS):
        tier, roll = TIERS[n % len(TIERS)], ROLLS[n % len(ROLLS)]
        with monkeypatch.context() as patch:
            patch.setattr(random.Random, "randint", lambda self, low, high, roll=roll: roll)
            recorder = MemoryRecorder()
            recorder.record(agent, _snapshot(customer, tier), agent_id="guess")
        guesses |= _digests(recorder.events)
    return guesses


def _snapshot(customer: str, tier: int) -> RunSnapshot:
    return RunSnapshot(code_version="keys.8", input={"customer": customer, "tier": tier})


def test_a_guessed_value_of_a_keyed_run_is_confirmed_neither_from_the_topic_nor_the_views(
    engine: Engine,
    settings: Settings,
    login: Login,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, public = key_pair_files(tmp_path)
    keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    recorder = Recorder(login("blackbox_writer", tenant=TENANT_A), settings=settings, keys=keys)
    snapshot = _snapshot("customer-17", 3)
    run, output = recorder.record(agent, snapshot, agent_id="keys-8", tenant_id=TENANT_A)
    guesses = _dictionary(monkeypatch)
    # The attack works on plain digests: the same run recorded without keys is found.
    with monkeypatch.context() as patch:
        patch.setattr(random.Random, "randint", lambda self, low, high: output["roll"])
        plain = MemoryRecorder()
        plain.record(agent, snapshot, agent_id="keys-8", tenant_id=TENANT_A)
    found = [e.event_type for e in plain.events if e.output_digest in guesses]
    assert found.count("tool.call") == 1
    assert found.count("random.draw") == 1
    assert "tool.call" in [e.event_type for e in plain.events if e.input_digest in guesses]

    recorded = envelopes(engine, run.run_id)
    assert all(d.startswith("hmac-sha256:") for d in _digests(recorded))
    relay = Relay(engine, settings=settings)
    try:
        assert relay.drain(timeout=60) == len(recorded)
    finally:
        relay.close()
    topic = [e for _, _, e in read_topic(settings.kafka_bootstrap, settings.topic, expect=4)]
    assert _digests(topic) == _digests(recorded)
    assert not _digests(topic) & guesses
    build_views(settings, engine, expect=len(recorded))
    reader = login("blackbox_reader", tenant=TENANT_A)
    with reader.connect() as conn:
        rows = conn.execute(
            text("SELECT input_digest, output_digest FROM blackbox_views.events")
        ).all()
    assert len(rows) == len(recorded)
    assert not {d for row in rows for d in row} & guesses


def test_a_tenant_a_writer_cannot_obtain_tenant_b_digest_key(
    engine: Engine, settings: Settings, login: Login, tmp_path: Path
) -> None:
    private, public = key_pair_files(tmp_path)
    keys = DataKeyStore.from_env({"BLACKBOX_KEK_PUBLIC_FILE": str(public)})
    assert keys is not None
    writer_b = login("blackbox_writer", tenant=TENANT_B)
    run, _ = Recorder(writer_b, settings=settings, keys=keys).record(
        agent, _snapshot("customer-3", 1), agent_id="keys-8", tenant_id=TENANT_B
    )
    before = table(engine, DIGEST_TABLES), table(engine, "TABLE blackbox.tenant_keys")
    writer_a = login("blackbox_writer", tenant=TENANT_A)
    with writer_a.begin() as conn, pytest.raises(AccessDenied, match="not granted tenant"):
        keys.tenant_digest_txn(conn, TENANT_B)
    for statement in (
        f"SELECT * FROM blackbox.tenant_digest_key('{TENANT_B}', NULL, NULL, NULL)",
        # Nor plant a key of its own choosing for a tenant that has none yet.
        "SELECT * FROM blackbox.tenant_digest_key('tenant-c', "
        "decode(repeat('00', 32), 'hex'), 'v1', '\\x00'::bytea)",
    ):
        with writer_a.begin() as conn, pytest.raises(ProgrammingError, match="not granted"):
            conn.execute(text(statement))
    assert (table(engine, DIGEST_TABLES), table(engine, "TABLE blackbox.tenant_keys")) == before
    # Its own tenant's key it gets, and it is not tenant B's.
    with writer_a.begin() as conn:
        own = keys.tenant_digest_txn(conn, TENANT_A)
    recorded = envelopes(engine, run.run_id)
    assert own({"customer": "customer-3", "tier": 1}, path="input") not in _digests(recorded)
    # Tenant B's runs replay under tenant B's key.
    replayer = login("blackbox_replayer", tenant=TENANT_B)
    report = replay_run(recorded, agent, **replaying(replayer, private, "finding 8 check"))
    assert report.passed, report.divergence and report.divergence.describe()
