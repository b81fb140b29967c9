"""Finding 2: deletion is unauthenticated.

The attacker has produce access to the event topic. They write ``run.redacted`` notes,
correctly chained after the runs' last events, that name tenant B's run and its data
key, or tenant A's run with tenant B's key. After a restore the operator runs
``blackbox ledger reapply``: the forged notes are listed with the reason and ignored
(exit 1), tenant B's key stays live and its run still opens, while the genuine note of
the retention job (signed, absent from the restored ledger) destroys the key a restore
brought back.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import RetentionJob, RetentionPolicy
from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore, LocalKeyProvider
from agent_blackbox.outbox import AgentRun, Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import (
    BodyCodec,
    CheckpointSigner,
    Envelope,
    EnvelopeCodec,
    PayloadPipeline,
    Settings,
    deletion_statement,
)
from tests.integration._kafka import read_topic
from tests.security.conftest import TENANT_A, TENANT_B

pytestmark = pytest.mark.integration

PROVIDER = LocalKeyProvider({"v1": os.urandom(32)})
POLICY = RetentionPolicy.from_mapping({"standard": {"bodies_days": 30, "metadata_days": 400}})
EVENTS_PER_RUN = 3  # run.started, tool.call, run.finished


def agent(run: AgentRun, input: Any) -> Any:
    return run.call("lookup", lambda who: {"balance": f"{who}: 1200 EUR"}, input["who"])


def _record(engine: Engine, settings: Settings, *, tenant: str, subject: str) -> str:
    recorder = Recorder(engine, settings=settings, keys=DataKeyStore(PROVIDER))
    snapshot = RunSnapshot(code_version="security.2", input={"who": subject})
    run, _ = recorder.record(
        agent, snapshot, agent_id="security-2", tenant_id=tenant, subject_ids=(subject,)
    )
    return run.run_id


def _relay(engine: Engine, settings: Settings) -> None:
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()


def _last_events(settings: Settings, expect: int) -> dict[str, Envelope]:
    last: dict[str, Envelope] = {}
    for _, _, envelope in read_topic(settings.kafka_bootstrap, settings.topic, expect=expect):
        if envelope.run_id not in last or envelope.sequence > last[envelope.run_id].sequence:
            last[envelope.run_id] = envelope
    return last


def _forged_note(
    after: Envelope,
    key_ids: list[str],
    *,
    signer: CheckpointSigner | None = None,
    version: int = 1,
) -> Envelope:
    """A run.redacted as a producer writes it: correctly chained after ``after``."""
    body: dict[str, Any] = {
        "reason": "forget",
        "retention_class": None,
        "subject_id": "whoever",
        "key_ids": key_ids,
    }
    if version == 2:
        statement = deletion_statement(
            run_id=after.run_id,
            tenant_id=after.tenant_id,
            sequence=after.sequence + 1,
            key_ids=key_ids,
            reason="forget",
            subject_id="whoever",
            retention_class=None,
        )
        signature = None if signer is None else signer.sign_statement(statement)
        body |= {"signer_key_id": None if signer is None else signer.key_id}
        body |= {"signature": signature}
    note = replace(
        after,
        event_id=str(uuid.uuid4()),
        sequence=after.sequence + 1,
        event_type="run.redacted",
        body_version=version,
        payload=BodyCodec().encode("run.redacted", version, body),
        payload_encoding="avro",
        key_id=None,
        attributes={"reason": "forget", "keys_destroyed": str(len(key_ids))},
        chain_hash="",
    )
    return replace(note, chain_hash=note.expected_chain_hash(after.chain_hash))


def _produce(settings: Settings, notes: list[Envelope]) -> None:
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    codec = EnvelopeCodec()
    for note in notes:
        producer.produce(settings.topic, key=note.run_id.encode(), value=codec.encode(note))
    assert producer.flush(30) == 0


def _key_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM blackbox.data_keys ORDER BY key_id"))
        return [dict(row) for row in rows.mappings()]


def _restore_keys(engine: Engine, backup: list[dict[str, Any]]) -> None:
    """An old backup comes back: its key rows, and its (empty) deletion ledger."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM blackbox.data_keys"))
        conn.execute(text("DELETE FROM blackbox.deletion_ledger"))
        for row in backup:
            conn.execute(
                text(
                    "INSERT INTO blackbox.data_keys (key_id, run_id, tenant_id, kek_version, "
                    "wrapped, created_at) VALUES (:key_id, :run_id, :tenant_id, :kek_version, "
                    ":wrapped, :created_at)"
                ),
                row,
            )


def _live(engine: Engine, run_id: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT bool_and(wrapped IS NOT NULL) FROM blackbox.data_keys WHERE run_id = :r"
                ),
                {"r": run_id},
            ).scalar_one()
        )


def test_forged_deletion_notes_are_reported_and_change_nothing(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    subject_a = f"alice-{uuid.uuid4().hex[:6]}"
    a_run = _record(engine, settings, tenant=TENANT_A, subject=subject_a)
    b_run = _record(engine, settings, tenant=TENANT_B, subject="bob")
    _relay(engine, settings)
    last = _last_events(settings, expect=2 * EVENTS_PER_RUN)
    keys = {row["run_id"]: row["key_id"] for row in _key_rows(engine)}
    backup = _key_rows(engine)

    # The retention job (holding the signer's key) genuinely forgets tenant A's subject.
    job_signer = CheckpointSigner.generate()  # known to verifiers by its fingerprint
    report = RetentionJob(engine, policy=POLICY, settings=settings, signer=job_signer).forget(
        subject_a
    )
    assert [r.run_id for r in report.redacted] == [a_run]
    _relay(engine, settings)
    a_last = _last_events(settings, expect=2 * EVENTS_PER_RUN + 1)[a_run]

    # The attacker, a producer only, writes correctly chained notes.
    attacker = CheckpointSigner.generate(key_id=job_signer.key_id)  # claims the job's key id
    _produce(
        settings,
        [
            _forged_note(last[b_run], [keys[b_run]]),  # tenant B's run and its key
            _forged_note(last[b_run], [keys[b_run]], signer=attacker, version=2),
            _forged_note(a_last, [keys[b_run]]),  # a key of another run, on A's run
            # even the job's own signature does not make another run's key destroyable
            _forged_note(a_last, [keys[b_run]], signer=job_signer, version=2),
        ],
    )

    # An old backup is restored: A's key is live again and the ledger does not know it.
    _restore_keys(engine, backup)
    assert _live(engine, a_run)
    assert _live(engine, b_run)

    public = tmp_path / "retention-job.pub.pem"
    public.write_bytes(job_signer.public_key_pem())
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_SIGNING_PUBLIC_KEYS": str(public),
        "COLUMNS": "400",
    }
    env.pop("BLACKBOX_SIGNING_KEY_FILE", None)
    result = CliRunner(env=env).invoke(main, ["ledger", "reapply"])
    assert result.exit_code == 1, result.output
    assert "1 applied, 4 ignored" in result.stdout
    assert "1 data keys a restore had brought back were destroyed again" in result.stdout
    assert "carries no signature" in result.stderr
    assert "does not verify" in result.stderr
    assert "belongs to another run" in result.stderr

    assert _live(engine, b_run)  # tenant B's key survived every forged note
    assert not _live(engine, a_run)  # the genuine note destroyed A's key again
    pipeline = PayloadPipeline(
        sealer=AesGcmSealer(AuditedKeys(engine, PROVIDER, purpose="security test 2"))
    )
    b_tool_call = _tool_call(settings, b_run)
    assert pipeline.unpack(b_tool_call)["tool"] == "lookup"
    with engine.connect() as conn:
        ledger = conn.execute(text("SELECT action, run_id FROM blackbox.deletion_ledger")).all()
    assert [tuple(row) for row in ledger] == [("reapply", a_run)]


def _tool_call(settings: Settings, run_id: str) -> Envelope:
    for _, _, envelope in read_topic(settings.kafka_bootstrap, settings.topic, expect=1):
        if envelope.run_id == run_id and envelope.event_type == "tool.call":
            return envelope
    raise AssertionError(f"no tool.call of run {run_id} in the topic")
