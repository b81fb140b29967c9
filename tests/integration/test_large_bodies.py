"""Large LLM replies through the real Postgres recorder: a 40 MB reply is kept whole in
the blob store and replays; a reply over the ceiling is recorded truncated and its
control flow replays."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, text

from agent_blackbox.keystore import (
    SEALED_ENCODING,
    AesGcmSealer,
    AuditedKeys,
    DataKeyStore,
    LocalKeyProvider,
)
from agent_blackbox.outbox import MemoryRecorder, Recorder, RunSnapshot
from agent_blackbox.outbox.integrations.openai import capture_openai
from agent_blackbox.outbox.storage import PostgresBlobs
from agent_blackbox.replayer import DivergenceKind, replay_run
from agent_blackbox.schemas import Envelope, PayloadPipeline, Settings, llm_reply
from tests.integration._agents import LARGE_REPLY_QUESTION, large_reply, large_reply_agent
from tests.integration._openai_server import OpenAIServer
from tests.integration._outbox import outbox_envelopes

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def _envelopes(engine: Engine, run_id: str) -> list[Envelope]:
    return outbox_envelopes(engine, run_id)


def _blob_size(engine: Engine, ref: str) -> int:
    with engine.connect() as conn:
        size: int = conn.execute(
            text("SELECT length(data) FROM blackbox.blobs WHERE digest = :d"), {"d": ref}
        ).scalar_one()
    return size


def _stored(envelope: Envelope, blobs: PostgresBlobs) -> bytes:
    """The stored bytes of ``envelope``'s body, in line or in the blob store."""
    if envelope.payload is not None:
        return envelope.payload
    assert envelope.payload_ref is not None
    return blobs.read(envelope.payload_ref)


def test_a_40_mb_reply_is_recorded_whole_and_replays(engine: Engine, settings: Settings) -> None:
    entry = large_reply_agent(large_reply(40 * MIB))
    recorder = Recorder(engine, settings=settings)
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    run, output = recorder.record(entry, snapshot, agent_id="large")
    assert output == {"starts": "Summary: ", "tool": "sunny in Paris"}

    events = _envelopes(engine, run.run_id)
    assert [e.event_type for e in events] == [
        "run.started",
        "llm.call",
        "tool.call",
        "run.finished",
    ]
    llm = events[1]
    assert llm.payload is None
    assert llm.payload_ref is not None
    # Random base64 text: zstd keeps about three quarters of it.
    assert _blob_size(engine, llm.payload_ref) > 28 * MIB
    assert "body_truncated" not in llm.attributes
    blobs = PostgresBlobs(engine)
    body = PayloadPipeline().unpack(llm, blobs.read(llm.payload_ref))
    assert body["body_truncated"] is None
    assert len(llm_reply(body).choices[0]["content"]) == len("Summary: ") + 40 * MIB

    report = replay_run(events, entry, blobs=blobs)
    assert report.result == "PASS", report.to_dict()
    assert report.events == 4


def test_a_reply_over_the_ceiling_is_recorded_truncated_and_its_control_flow_replays(
    engine: Engine, settings: Settings
) -> None:
    low = replace(settings, max_blob_bytes=1 * MIB)
    entry = large_reply_agent(large_reply(3 * MIB))
    recorder = Recorder(engine, settings=low)
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    run, output = recorder.record(entry, snapshot, agent_id="large")
    assert output == {"starts": "Summary: ", "tool": "sunny in Paris"}  # nothing was lost

    events = _envelopes(engine, run.run_id)
    assert [e.event_type for e in events] == [
        "run.started",
        "llm.call",
        "tool.call",
        "run.finished",
    ]
    llm = events[1]
    assert llm.attributes["body_truncated"] == "true"
    blobs = PostgresBlobs(engine)
    stored = _stored(llm, blobs)  # in line when compression took it under the threshold
    assert len(stored) <= 1 * MIB
    body = PayloadPipeline().unpack(llm, stored)
    assert body["body_truncated"]["response_bytes"] > 3 * MIB
    assert body["raw_response_json"] is None

    report = replay_run(events, entry, blobs=blobs)
    assert report.result == "LIMITED", report.to_dict()
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "limited"}
    assert len(report.notes) == 1
    assert "sequence 2 (llm.call)" in report.notes[0]

    # Control flow is still checked past the truncated reply: another tool is caught.
    def changed(run: object, question: object) -> object:
        answer = run.llm(  # type: ignore[attr-defined]
            lambda _: {},
            {"model": "m-large", "messages": [{"role": "user", "content": question}]},
            provider="test",
            model="m-large",
        )
        name = answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
        return run.call(name + "_v2", lambda city: city, city="Paris")  # type: ignore[attr-defined]

    diverged = replay_run(events, changed, blobs=blobs)
    assert diverged.divergence is not None
    assert diverged.divergence.kind == DivergenceKind.ARGUMENT_MISMATCH
    assert diverged.divergence.sequence == 3


def test_a_sealed_reply_over_the_ceiling_is_truncated_sealed_and_replays(
    engine: Engine, settings: Settings
) -> None:
    provider = LocalKeyProvider({"v1": os.urandom(32)})
    low = replace(settings, max_blob_bytes=1 * MIB)
    entry = large_reply_agent(large_reply(3 * MIB))
    recorder = Recorder(engine, settings=low, keys=DataKeyStore(provider))
    snapshot = RunSnapshot(code_version="v1", input=LARGE_REPLY_QUESTION)
    run, _ = recorder.record(entry, snapshot, agent_id="large")

    events = _envelopes(engine, run.run_id)
    assert {e.payload_encoding for e in events} <= {
        SEALED_ENCODING,
        "avro+zstd-d1+pad1+" + SEALED_ENCODING[5:],
    }
    llm = events[1]
    assert llm.attributes["body_truncated"] == "true"
    blob = _stored(llm, PostgresBlobs(engine))
    assert len(blob) <= 1 * MIB
    text = large_reply(3 * MIB)["choices"][0]["message"]["content"]
    assert text[:64].encode() not in blob  # sealed like every other body of the run

    keys = AuditedKeys(engine, provider, purpose="large reply replay")
    pipeline = PayloadPipeline(sealer=AesGcmSealer(keys))
    report = replay_run(events, entry, pipeline=pipeline, blobs=PostgresBlobs(engine), digests=keys)
    assert report.result == "LIMITED", report.to_dict()
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "limited"}


def test_an_openai_reply_over_the_ceiling_replays_through_the_sdk_capture() -> None:
    big = large_reply(2 * MIB)["choices"][0]["message"]["content"]  # does not compress

    def agent(llm: Any) -> Any:
        completion = llm.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": big}]
        )
        return {"starts": completion.choices[0].message.content[:12]}

    recorder = MemoryRecorder(settings=Settings(max_blob_bytes=1 * MIB))
    snapshot = RunSnapshot(code_version="v1", input=None)
    with (
        OpenAIServer() as server,
        openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0) as sdk,
    ):
        _, output = recorder.record(
            lambda run, _: agent(capture_openai(sdk, run)), snapshot, agent_id="openai-large"
        )
        assert output == {"starts": "echo: " + big[:6]}
        before = len(server.requests)
        report = replay_run(
            recorder.events,
            lambda run, _: agent(capture_openai(sdk, run)),
            blobs=recorder,
        )
        assert len(server.requests) == before  # replay sent nothing
    assert report.result == "LIMITED", report.to_dict()
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "limited"}
    (llm,) = [e for e in recorder.events if e.event_type == "llm.call"]
    assert llm.attributes["body_truncated"] == "true"
