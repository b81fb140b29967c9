"""Helpers of the signer and verify findings: a signing key, forged envelopes written
with produce access only, the signer run until a condition holds, and ``blackbox verify``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from confluent_kafka import Producer
from sqlalchemy import Engine, text

from agent_blackbox.cli import main
from agent_blackbox.consumers import CheckpointConsumer, CheckpointPolicy
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    CheckpointSigner,
    Envelope,
    EnvelopeCodec,
    Settings,
)
from tests.integration._kafka import read_topic
from tests.integration._wait import eventually


@dataclass(frozen=True)
class SigningKey:
    signer: CheckpointSigner
    path: Path


def signing_key(tmp_path: Path) -> SigningKey:
    signer = CheckpointSigner.generate(key_id="signer-1")
    path = tmp_path / "signing.pem"
    path.write_bytes(signer.private_key_pem())
    path.chmod(0o600)
    return SigningKey(signer, path)


def rechain(events: Iterable[Envelope], *, run_id: str | None = None) -> list[Envelope]:
    """``events`` renumbered from 1 (under ``run_id``) with every chain hash recomputed:
    what anyone can do, since the chain is plain SHA-256."""
    chained: list[Envelope] = []
    previous = GENESIS_CHAIN_HASH
    for sequence, event in enumerate(events, start=1):
        event = replace(
            event,
            run_id=run_id or event.run_id,
            sequence=sequence,
            event_id=str(uuid.uuid4()),
            chain_hash="",
        )
        event = replace(event, chain_hash=event.expected_chain_hash(previous))
        chained.append(event)
        previous = event.chain_hash
    return chained


def produce(settings: Settings, envelopes: Iterable[Envelope]) -> None:
    """Write ``envelopes`` to the event topic as a Kafka producer with no database access
    would: keyed by run id with the relay's partitioner, so they land beside the run."""
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    codec = EnvelopeCodec()
    for envelope in envelopes:
        producer.produce(settings.topic, codec.encode(envelope), key=envelope.run_id.encode())
    assert producer.flush(30) == 0, "the forged events were not acknowledged"


def relay_all(settings: Settings, engine: Engine) -> None:
    relay = Relay(engine, settings=settings)
    try:
        relay.drain(timeout=60)
    finally:
        relay.close()


def topic_events(settings: Settings, run_id: str, *, expect: int) -> list[Envelope]:
    """The events of ``run_id`` in the topic, in sequence order."""
    every = read_topic(settings.kafka_bootstrap, settings.topic, expect=expect)
    return sorted((e for _, _, e in every if e.run_id == run_id), key=lambda e: e.sequence)


def crashed_run(recorder: Recorder, *, reads: int = 3) -> tuple[str, int]:
    """A run that recorded ``reads`` clock reads and then its process died (no
    run.finished, still ``running`` in blackbox.runs): its id and last sequence."""
    run = recorder.start_run(RunSnapshot(code_version="crash-1"), agent_id="crashing-agent")
    for _ in range(reads):
        run.now()
    return run.run_id, run.last_sequence


def sign_until(
    settings: Settings,
    engine: Engine,
    signer: CheckpointSigner,
    done: Callable[[], Any],
    *,
    policy: CheckpointPolicy | None = None,
    what: str,
) -> None:
    """Run the checkpoint signer until ``done()`` holds."""
    with CheckpointConsumer(settings, signer, engine=engine, policy=policy) as consumer:

        def signed() -> Any:
            consumer.poll_once(0.5)
            return done()

        eventually(signed, timeout=60, what=what)


def violations(engine: Engine, run_id: str) -> list[tuple[str, int]]:
    """The (kind, sequence) of every integrity violation recorded for ``run_id``."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, sequence FROM blackbox_views.integrity_violations "
                "WHERE run_id = :r ORDER BY id"
            ),
            {"r": run_id},
        )
        return [(str(k), int(s)) for k, s in rows]


def verify(
    settings: Settings, key: SigningKey, *args: str, as_user: Engine | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """``blackbox verify ARGS --json`` (connected as ``as_user``'s login, else as the
    owner): its exit code and reports."""
    url = settings.database_url
    if as_user is not None:
        url = as_user.url.render_as_string(hide_password=False)
    env = {
        "BLACKBOX_DATABASE_URL": url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_SIGNING_KEY_FILE": str(key.path),
        "BLACKBOX_SIGNING_KEY_ID": key.signer.key_id,
    }
    result = CliRunner(env=env).invoke(main, ["verify", *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)
