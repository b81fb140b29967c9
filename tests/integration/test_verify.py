"""Tamper evidence on the real stack: the signer consumer signs chain heads from the
topic, ``blackbox verify`` checks runs read back from Kafka against them, finds a flipped
byte at its sequence, and refuses a forged checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import CheckpointConsumer, ViewRunIndex, load_checkpoint
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.replayer import write_archive
from agent_blackbox.schemas import CheckpointSigner, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._kafka import read_topic
from tests.integration._views import build_views
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def signing_key(tmp_path: Path) -> tuple[CheckpointSigner, Path]:
    signer = CheckpointSigner.generate(key_id="signer-1")
    path = tmp_path / "signing.pem"
    path.touch(mode=0o600)
    path.write_bytes(signer.private_key_pem())
    return signer, path


def _signed_runs(settings: Settings, engine: Engine, signer: CheckpointSigner) -> list[str]:
    recorded = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(3))
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    build_views(settings, engine, expect=sum(r.events for r in recorded))
    index = ViewRunIndex(engine)
    with CheckpointConsumer(settings, signer, engine=engine) as consumer:

        def signed() -> bool:
            consumer.poll_once(0.5)
            return all(index.checkpoint(r.run_id) is not None for r in recorded)

        eventually(signed, timeout=60, what="a checkpoint for every run")
    return [r.run_id for r in recorded]


def test_verify_checks_runs_from_kafka_against_their_signed_heads(
    settings: Settings, engine: Engine, signing_key: tuple[CheckpointSigner, Path], tmp_path: Path
) -> None:
    signer, key_file = signing_key
    run_ids = _signed_runs(settings, engine, signer)
    checkpoint = load_checkpoint(engine, run_ids[0])
    assert checkpoint is not None
    assert (checkpoint.last_sequence, checkpoint.signer_key_id) == (11, "signer-1")
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_SIGNING_KEY_FILE": str(key_file),
        "BLACKBOX_SIGNING_KEY_ID": "signer-1",
    }
    clean = CliRunner(env=env).invoke(main, ["verify", "--all", "--require-checkpoint", "--json"])
    assert clean.exit_code == 0, clean.output
    reports = json.loads(clean.stdout)
    assert [(r["ok"], r["checkpoint"]) for r in reports] == [(True, "valid")] * 3

    # A copy of the topic in which one byte of one stored event was flipped.
    events = sorted(
        (
            e
            for _, _, e in read_topic(settings.kafka_bootstrap, settings.topic, expect=33)
            if e.run_id == run_ids[0]
        ),
        key=lambda e: e.sequence,
    )
    payload = events[6].payload
    assert payload is not None
    events[6] = replace(events[6], payload=payload[:-1] + bytes([payload[-1] ^ 0x01]))
    archive = tmp_path / "tampered.avro"
    write_archive(archive, events)
    found = CliRunner(env=env).invoke(
        main, ["verify", run_ids[0], "--archive", str(archive), "--json"]
    )
    assert found.exit_code == 1
    [report] = json.loads(found.stdout)
    assert (report["problem"], report["sequence"]) == ("broken_chain", 7)

    # A checkpoint re-signed by another key, or edited, is refused.
    forger = CheckpointSigner.generate(key_id="signer-1")
    forged = forger.sign(
        run_id=run_ids[1], tenant_id="default", last_sequence=11, chain_head="0" * 64
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE blackbox_views.checkpoints SET signature = :s, chain_head = :h "
                "WHERE run_id = :r"
            ),
            {"s": forged.to_record()["signature"], "h": "0" * 64, "r": run_ids[1]},
        )
    refused = CliRunner(env=env).invoke(main, ["verify", run_ids[1], "--json"])
    assert refused.exit_code == 1
    [report] = json.loads(refused.stdout)
    assert (report["problem"], report["checkpoint"]) == ("forged_checkpoint", "forged")
