"""Compressed payloads and requests stored by reference on the real stack: a
conversation agent recorded encrypted through Postgres, relayed to Kafka, then read
back by replay, re-execution and the console's body view (one body, or a whole run's
in one pass), each of which gets the exact request the agent sent; runs recorded
uncompressed beside it still read."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.keystore import AesGcmSealer, AuditedKeys, DataKeyStore
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import (
    KafkaRunSource,
    open_bodies,
    open_body,
    reexecute,
    replay_run,
)
from agent_blackbox.schemas import EventType, PayloadPipeline, Settings, canonical_text
from tests.integration._backups import KEK, PROVIDER, relay
from tests.integration._views import build_views
from tests.unit.test_payload_compression import _reply, _sent, chat_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TURNS = 15


def _record(engine: Engine, settings: Settings, **store: str) -> str:
    recorder = Recorder(engine, settings=replace(settings, **store), keys=DataKeyStore(PROVIDER))
    run, _ = recorder.record(
        chat_agent, RunSnapshot(code_version="c1", input={"turns": TURNS}), agent_id="chat"
    )
    return run.run_id


def _stored_bytes(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT coalesce(sum(length(envelope)), 0) FROM blackbox.outbox "
                    "WHERE run_id = :r"
                ),
                {"r": run_id},
            ).scalar_one()
        )


@pytest.fixture
def runs(engine: Engine, settings: Settings) -> dict[str, str]:
    """One run stored the default way and one uncompressed, published and indexed."""
    ids = {
        "default": _record(engine, settings),
        "none": _record(engine, settings, payload_compression="none", llm_request_references="off"),
    }
    ids["sizes"] = f"{_stored_bytes(engine, ids['default'])}/{_stored_bytes(engine, ids['none'])}"
    relay(engine, settings)
    build_views(settings, engine, expect=2 * (2 + TURNS))
    return ids


def _opening(engine: Engine, purpose: str) -> tuple[PayloadPipeline, AuditedKeys]:
    keys = AuditedKeys(engine, PROVIDER, purpose=purpose)
    return PayloadPipeline(sealer=AesGcmSealer(keys)), keys


def test_every_reader_gets_the_exact_requests_back(
    engine: Engine, settings: Settings, runs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    default, none = runs["default"], runs["none"]
    compressed, whole = (int(n) for n in runs["sizes"].split("/"))
    assert compressed * 5 < whole, runs["sizes"]
    index = ViewRunIndex(engine)
    sent: list[str] = []

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        sent.append(canonical_text(request))
        return _reply(request)

    for run_id in (default, none):
        events = list(KafkaRunSource(settings, index, run_id))
        calls = [e for e in events if e.event_type == EventType.LLM_CALL]
        encodings = {e.payload_encoding for e in calls}
        if run_id == default:
            # Compressed, padded to a size bucket, sealed; a short body padding would not
            # shrink is stored whole.
            assert "avro+zstd-d1+pad1+aes256gcm+aad2" in encodings
            assert encodings <= {"avro+zstd-d1+pad1+aes256gcm+aad2", "avro+aes256gcm+aad2"}
        else:
            assert encodings == {"avro+aes256gcm+aad2"}
        pipeline, keys = _opening(engine, "ticket 77: compression check")
        report = replay_run(
            events, chat_agent, blobs=PostgresBlobs(engine), pipeline=pipeline, digests=keys
        )
        assert report.passed, report.error or (report.divergence and report.divergence.describe())
        sent.clear()
        diffs = reexecute(events, send, pipeline=_opening(engine, "ticket 77: re-execution")[0])
        assert all(d.same for d in diffs)
        assert sent == _sent(TURNS)

    # The console opens one body in the middle of the run: the calls it continues are
    # opened on the way, and the request is whole.
    monkeypatch.setenv("BLACKBOX_KEK", f"v1:{base64.b64encode(KEK).decode()}")
    monkeypatch.delenv("BLACKBOX_KEK_FILE", raising=False)
    middle = TURNS // 2 + 2  # run.started, then one llm.call a turn
    opened = open_body(
        settings, engine, index, default, middle, purpose="ticket 77: one body in the console"
    )
    assert opened.withheld is None, opened.withheld
    assert opened.body is not None
    assert canonical_text(opened.body["raw_request"]) == _sent(TURNS)[middle - 2]

    # A run's conversation: every LLM call opened in one pass for one purpose, each
    # body its own request row in the audit, the run's data key unwrapped once.
    purpose = "ticket 77: the whole conversation"
    calls = list(range(2, TURNS + 2))
    bodies = open_bodies(settings, engine, index, default, calls, purpose=purpose)
    assert [b.envelope.sequence for b in bodies] == calls
    assert [canonical_text(b.body["raw_request"]) for b in bodies if b.body] == _sent(TURNS)
    with engine.connect() as conn:
        outcomes = conn.execute(
            text(
                "SELECT outcome, count(*) FROM blackbox.access_audit WHERE purpose = :p "
                "GROUP BY outcome"
            ),
            {"p": purpose},
        ).all()
    assert dict(outcomes) == {"requested": TURNS, "granted": 1}
