"""The replayer's readers of the topic against poison and a stale relay's copy, produced
straight to the real topic: ``verify`` and ``replay`` of one run (through the index) and
of the whole history (one pass over the topic, in worker processes) skip and report
every message that is not an event, and never use the stale copy."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine

from agent_blackbox.broker import LeaseStamp, ensure_topics, new_producer, producer_config
from agent_blackbox.cli import main
from agent_blackbox.outbox import Recorder
from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Envelope, EnvelopeCodec, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._kafka import read_topic
from tests.integration._relays import grant_epoch
from tests.integration._views import build_views

pytestmark = pytest.mark.integration

CODEC = EnvelopeCodec()
STALE_AT = 7
"""The sequence of run 0 a stale relay's (tampered) copy is delivered for."""


def _poison(key: bytes, good: bytes, other: Envelope) -> list[tuple[bytes | None, bytes | None]]:
    return [
        (key, b"\x7fthese are not the bytes of an envelope"),
        (key, b"\xc3\x01" + b"\x00" * 8 + good[10:]),  # a fingerprint no schema has
        (key, b""),
        (key, None),
        (key, good[: len(good) // 2]),  # truncated Avro
        (key, b"\x00" + struct.pack(">I", 99) + good[10:]),  # a schema id: no registry
        (key, CODEC.encode(other)),  # another run's envelope under this key
        (b"no-such-run", b"junk under a key no run has"),
    ]


def _history(settings: Settings, engine: Engine) -> list[str]:
    """Three recorded runs, published to a first topic by the relay, then copied into
    ``settings.topic`` as a relay of epoch 2 would have; into run 0, after sequence 6,
    eight poison messages and a tampered copy of sequence 7 from the relay of epoch 1
    that lost the shard."""
    relayed = replace(settings, topic=f"{settings.topic}.relayed")
    recorded = record_ticket_runs(Recorder(engine, settings=relayed), ticket_ids(3))
    relay = Relay(engine, settings=relayed)
    relay.drain(timeout=60)
    relay.close()
    total = sum(r.events for r in recorded)
    events = sorted(
        (e for _, _, e in read_topic(relayed.kafka_bootstrap, relayed.topic, expect=total)),
        key=lambda e: (e.run_id, e.sequence),
    )
    target = recorded[0].run_id
    grant_epoch(engine, 0, 2)  # the lease of shard 0 moved on
    ensure_topics(settings)
    producer = new_producer(settings, producer_config(settings))
    live, stale = [LeaseStamp(0, 2).header()], [LeaseStamp(0, 1).header()]
    other = next(e for e in events if e.run_id != target)
    for envelope in events:
        key = envelope.run_id.encode()
        if envelope.run_id == target and envelope.sequence == STALE_AT:
            for poison_key, value in _poison(key, CODEC.encode(envelope), other):
                producer.produce(settings.topic, value, poison_key, headers=live)
            payload = envelope.payload or b"\x00"
            tampered = replace(envelope, payload=payload[:-1] + bytes([payload[-1] ^ 1]))
            producer.produce(settings.topic, CODEC.encode(tampered), key, headers=stale)
        producer.produce(settings.topic, CODEC.encode(envelope), key, headers=live)
    assert producer.flush(30) == 0
    build_views(settings, engine, expect=total)
    return [r.run_id for r in recorded]


def _env(settings: Settings) -> dict[str, str | None]:
    return {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_AGENTS": "ticket-agent=agent_blackbox.examples.ticket_agent:replay_entry",
        "BLACKBOX_PURPOSE": "test of the topic readers",
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
        "BLACKBOX_SIGNING_KEY_FILE": None,
        "BLACKBOX_SIGNING_PUBLIC_KEYS": None,
    }


def _lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def _assert_poison_listed(skipped: list[dict[str, Any]], run_id: str) -> None:
    under_run = [m for m in skipped if m["key"] == run_id]
    assert len(under_run) == 7, skipped
    partitions = {m["partition"] for m in under_run}
    assert len(partitions) == 1
    offsets = [m["offset"] for m in under_run]
    assert offsets == list(range(offsets[0], offsets[0] + 7))
    reasons = " | ".join(m["reason"] for m in under_run)
    for words in (
        "not an envelope",
        "unknown writer schema fingerprint",
        "empty value",
        "not valid Avro",
        "no schema registry",
        "an envelope of run",
    ):
        assert words in reasons


def test_verify_and_replay_skip_poison_and_never_use_a_stale_copy(
    settings: Settings, engine: Engine
) -> None:
    run_ids = _history(settings, engine)
    target = run_ids[0]
    runner = CliRunner(env=_env(settings))

    one = runner.invoke(main, ["verify", target, "--json"])
    assert one.exit_code == 1, one.output  # the poison under its key is a finding
    [report] = json.loads(one.stdout)
    assert (report["problem"], report["result"], report["events"]) == (None, "unverified", 11)
    _assert_poison_listed(report["skipped_messages"], target)

    every = runner.invoke(main, ["verify", "--all", "--json", "--workers", "2"])
    assert every.exit_code == 1, every.output
    reports = {r["run_id"]: r for r in json.loads(every.stdout)}
    assert set(reports) == {*run_ids, "no-such-run"}
    for run_id in run_ids:  # the tampered stale copy of sequence 7 was fenced off
        assert (reports[run_id]["problem"], reports[run_id]["events"]) == (None, 11)
    _assert_poison_listed(reports[target]["skipped_messages"], target)
    assert reports["no-such-run"]["problem"] == "unreadable"
    assert [m["key"] for m in reports["no-such-run"]["skipped_messages"]] == ["no-such-run"]

    table = runner.invoke(main, ["verify", "--all", "--workers", "1"])
    assert table.exit_code == 1, table.output
    assert "Tamper evidence" in table.stdout
    assert "Messages skipped" in table.stdout
    assert "3/4 runs verified" not in table.stdout  # unverified: no checkpoints here

    batch = runner.invoke(main, ["replay", "--all", "--json", "--workers", "2"])
    assert batch.exit_code == 0, batch.output
    *lines, summary = _lines(batch)
    assert sorted((line["run_id"], line["result"]) for line in lines) == sorted(
        (run_id, "PASS") for run_id in run_ids
    )
    assert len(summary["skipped_messages"]) == 8
    _assert_poison_listed(summary["skipped_messages"], target)

    single = runner.invoke(main, ["replay", target, "--json"])
    assert single.exit_code == 0, single.output
    [line, summary] = _lines(single)
    assert (line["result"], line["events"]) == ("PASS", 11)
    _assert_poison_listed(summary["skipped_messages"], target)

    text = runner.invoke(main, ["replay", target])
    assert text.exit_code == 0, text.output
    assert "PASS" in text.stdout
    assert "7 messages of the topic were skipped" in text.stderr
