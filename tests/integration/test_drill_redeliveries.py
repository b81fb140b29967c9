"""The restore drill on a history where the relay re-delivered messages (issue 31, item 1).

A relay that restarts publishes again what it had published but not yet deleted: the
topic then holds a second, identical copy of some events (same key, same value). Every
reader deduplicates them; the drill counts distinct events (run, sequence, event id),
reports the copies as a figure and passes. A copy that is NOT the same event (same run
and sequence, another event id or other bytes) still fails it, naming the run.

The replay sample is drawn from the agents that have an entry point; the runs of the
other agents are counted as skipped, never a failure.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Message
from sqlalchemy import Engine

from agent_blackbox.backup import (
    BackupStore,
    DrillOptions,
    RestoreRequest,
    drop_target,
    open_store,
    restore_runs,
    run_drill,
)
from agent_blackbox.broker import new_producer, producer_config
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import EnvelopeCodec, Settings
from tests.integration._backups import (
    AGENTS,
    KEK,
    SIGNER,
    VERIFIER,
    cut,
    events,
    lookup_agent,
    record,
    relay,
)
from tests.integration._kafka import read_messages

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
_RUNS_CHECK = "events per run, contiguous sequences"
_SAMPLE_CHECK = "sample of runs replayed"


@pytest.fixture(autouse=True)
def replay_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the drill's child processes (verify, replay) need."""
    pem = tmp_path / "signer.pem"
    pem.write_bytes(SIGNER.public_key_pem())
    monkeypatch.setenv("BLACKBOX_SIGNING_PUBLIC_KEYS", str(pem))
    monkeypatch.delenv("BLACKBOX_SIGNING_KEY_FILE", raising=False)
    monkeypatch.setenv("BLACKBOX_KEK", f"v1:{base64.b64encode(KEK).decode()}")
    monkeypatch.setenv("BLACKBOX_AGENTS", AGENTS)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


@pytest.fixture
def store(s3_url: str) -> BackupStore:
    return open_store(s3_url)


def _republish(settings: Settings, messages: list[Message]) -> None:
    """Produce ``messages`` again to their own partitions, as a restarted relay does."""
    producer = new_producer(settings, producer_config(settings))
    for message in messages:
        producer.produce(
            settings.topic,
            key=message.key(),
            value=message.value(),
            partition=message.partition(),
            headers=message.headers() or [],
        )
    assert producer.flush(30) == 0


def _topic(settings: Settings, engine: Engine) -> list[Message]:
    return read_messages(settings.kafka_bootstrap, settings.topic, expect=events(engine))


def _record_other_agent(engine: Engine, settings: Settings, who: str) -> str:
    """A run of an agent no entry point is configured for."""
    recorder = Recorder(engine, settings=settings)
    snapshot = RunSnapshot(code_version="other.1", input={"who": who})
    run, _ = recorder.record(lookup_agent, snapshot, agent_id="no-entry-point")
    return run.run_id


def test_re_delivered_copies_pass_the_drill_and_a_restore_and_are_counted(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    runs = [record(engine, settings, who) for who in ("ada", "grace", "edsger")]
    relay(engine, settings)
    messages = _topic(settings, engine)
    copies = [m for m in messages if m.key() == runs[0].encode()][:3]
    copies += [m for m in messages if m.key() == runs[1].encode()][-2:]
    _republish(settings, copies)  # the tail of the topic, as a relay restart leaves it
    cut(settings, engine, store)

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=5))

    failed = [(c.name, c.detail, c.where) for c in report.checks if c.passed is False]
    assert failed == []
    assert report.passed
    checks = {c.name: c for c in report.checks}
    assert "5 re-delivered copies counted once" in checks[_RUNS_CHECK].detail
    assert report.duplicates == 5
    assert report.events == events(engine)  # distinct events, not messages
    assert checks[_SAMPLE_CHECK].passed is True
    assert report.to_dict()["duplicates"] == 5
    request = RestoreRequest(
        into=f"t{uuid.uuid4().hex[:10]}", purpose="count copies", run_ids=frozenset(runs[:1])
    )
    restored = restore_runs(settings, store, request, verifier=VERIFIER)
    try:
        assert (restored.copy.events, restored.copy.messages) == (4, 7)
        assert restored.copy.tally.duplicates == 3
    finally:
        assert drop_target(settings, restored.target) == []


@pytest.mark.parametrize("conflict", ["other event id", "other bytes"])
def test_a_conflicting_copy_fails_the_drill_naming_the_run(
    settings: Settings, engine: Engine, store: BackupStore, conflict: str
) -> None:
    run_id = record(engine, settings, "ada")
    record(engine, settings, "grace")
    relay(engine, settings)
    [original] = [m for m in _topic(settings, engine) if m.key() == run_id.encode()][1:2]
    codec = EnvelopeCodec()
    envelope = codec.decode(original.value())
    if conflict == "other event id":
        envelope = dataclasses.replace(envelope, event_id=str(uuid.uuid4()))
    else:
        envelope = dataclasses.replace(envelope, input_digest="0" * 64)
    forged = _ForgedMessage(original, codec.encode(envelope))
    _republish(settings, [forged])  # type: ignore[list-item]
    cut(settings, engine, store)

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=0))

    assert not report.passed
    runs_check = next(c for c in report.checks if c.name == _RUNS_CHECK)
    assert runs_check.passed is False
    assert any(
        run_id in w and f"sequence {envelope.sequence}" in w and conflict in w
        for w in runs_check.where
    ), runs_check.where


class _ForgedMessage:
    """A topic message with another value (what :func:`_republish` reads of it)."""

    def __init__(self, original: Message, value: bytes) -> None:
        self._original, self._value = original, value

    def key(self) -> bytes | None:
        return self._original.key()

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return self._original.partition() or 0

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._original.headers()  # type: ignore[return-value]


def test_the_replay_sample_is_drawn_from_agents_with_an_entry_point(
    settings: Settings, engine: Engine, store: BackupStore
) -> None:
    replayable = [record(engine, settings, who) for who in ("ada", "grace")]
    others = [_record_other_agent(engine, settings, who) for who in ("linus", "ken", "dmr")]
    relay(engine, settings)
    cut(settings, engine, store)

    report = run_drill(settings, store, verifier=VERIFIER, options=DrillOptions(sample=20))

    assert report.passed, [(c.name, c.detail, c.where) for c in report.checks if not c.passed]
    sample = next(c for c in report.checks if c.name == _SAMPLE_CHECK)
    assert sample.passed is True
    assert sample.detail.startswith(f"{len(replayable)} runs: {len(replayable)} passed")
    assert f"{len(others)} runs of 1 agent without an entry point skipped" in sample.detail
    assert report.skipped == len(others)
