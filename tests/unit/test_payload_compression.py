"""Compressed payloads and LLM requests stored by reference, without a service: every
setting opens, hostile frames are refused by name, and every reader gets the exact
request the agent sent."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from typing import Any

import pytest
import zstandard
from click.testing import CliRunner

from agent_blackbox.cli import main
from agent_blackbox.keystore import SEALED_ENCODING, AesGcmSealer
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import reexecute, replay_run
from agent_blackbox.replayer._export import event_records
from agent_blackbox.schemas import (
    COMPRESSIONS,
    Envelope,
    EventType,
    PayloadContext,
    PayloadPipeline,
    RequestPrefixMissing,
    SealedRunGuard,
    Settings,
    SplitRequest,
    UndecodableMessage,
    _request_prefix,
    canonical_text,
    is_plaintext,
)
from agent_blackbox.schemas._compression import split_encoding, with_compression
from agent_blackbox.schemas._padding import bucket
from tests.unit.test_sealing import KEY, OneKey

SYSTEM = "You are a careful support agent. " * 20


def _reply(request: Any) -> dict[str, Any]:
    turn = len(request["messages"])
    return {
        "id": f"r{turn}",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"answer {turn} " * 30},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10 * turn, "completion_tokens": 30, "total_tokens": 10 * turn},
    }


def chat_agent(run: AgentRun, input: Any) -> Any:
    """Turns of one conversation; the agent edits its own list in place as agents do."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(input["turns"]):
        messages.append({"role": "user", "content": f"question {turn}: " + "why? " * 40})
        reply = run.llm(_reply, {"model": "m", "messages": messages}, provider="openai")
        messages.append(reply["choices"][0]["message"])
        if turn == 0:
            messages[1]["edited"] = True  # changed after the call: recorded as it was sent
    return len(messages)


def _sent(turns: int) -> list[str]:
    """The canonical JSON of each request ``chat_agent`` sends, as the model got it."""
    sent: list[str] = []
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}: " + "why? " * 40})
        sent.append(canonical_text({"model": "m", "messages": messages}))
        messages.append(_reply({"messages": messages})["choices"][0]["message"])
        if turn == 0:
            messages[1]["edited"] = True
    return sent


def _record(turns: int = 12, **settings: Any) -> MemoryRecorder:
    recorder = MemoryRecorder(settings=Settings(**settings))
    snapshot = RunSnapshot(code_version="c1", input={"turns": turns})
    recorder.record(chat_agent, snapshot, agent_id="chat")
    return recorder


def _llm(events: list[Envelope]) -> list[Envelope]:
    return [e for e in events if e.event_type == EventType.LLM_CALL]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_compression_records_opens_and_replays(compression: str) -> None:
    recorder = _record(payload_compression=compression)
    scheme = {"zstd": "zstd-d1", "zstd-nodict": "zstd", "deflate": "deflate", "none": None}
    encodings = {e.payload_encoding for e in _llm(recorder.events)}
    assert encodings == {"avro" if scheme[compression] is None else f"avro+{scheme[compression]}"}
    pipeline = PayloadPipeline()  # opens every compression, whatever it packs with
    texts = [pipeline.unpack(e)["raw_request_json"] for e in _llm(recorder.events)]
    assert texts == _sent(12)
    assert replay_run(recorder.events, chat_agent).passed


def test_compression_and_references_shrink_a_conversation() -> None:
    whole = _record(turns=30, payload_compression="none", llm_request_references="off")
    stored = _record(turns=30)
    before = sum(len(e.payload or b"") for e in _llm(whole.events))
    after = sum(len(e.payload or b"") for e in _llm(stored.events))
    assert after * 5 < before, (before, after)


def test_small_bodies_stay_uncompressed() -> None:
    recorder = MemoryRecorder(settings=Settings(payload_compression="zstd"))
    run = recorder.start_run(RunSnapshot("c1", {}), agent_id="tiny")
    run.now()
    run.finish(output=None)
    clock = next(e for e in recorder.events if e.event_type == EventType.CLOCK_READ)
    assert clock.payload_encoding == "avro"


def test_requests_are_stored_by_reference_and_rebuilt_exactly() -> None:
    recorder = _record()
    calls = _llm(recorder.events)
    raw = PayloadPipeline(compression="none")
    stored = [raw._reader.read(e.event_type, e.body_version, _inflated(e)) for e in calls]
    assert stored[0]["request_prefix"] is None
    later = [s["request_prefix"] for s in stored[1:]]
    assert all(p is not None and p["key"] == "messages" for p in later)
    # Turn n names turn n-1 and keeps only what is new: the question and the answer.
    assert [p["sequence"] for p in later] == [e.sequence for e in calls[:-1]]
    # Turn 6 stores only what is new since turn 5: its answer and the next question.
    assert len(json.loads(stored[5]["raw_request_json"])["messages"]) == 2
    # The edit made to message 1 after turn 1 is a change: only the system prompt is
    # shared with turn 1.
    assert later[0]["items"] == 1
    pipeline = PayloadPipeline()
    rebuilt = [pipeline.unpack(e) for e in calls]
    assert [body["raw_request_json"] for body in rebuilt] == _sent(12)
    assert all(body["request_prefix"] is None for body in rebuilt)  # whole, as if stored so


def _inflated(envelope: Envelope) -> bytes:
    scheme, _ = split_encoding(envelope.payload_encoding)
    assert envelope.payload is not None
    if scheme is None:
        return envelope.payload
    return PayloadPipeline()._inflater.inflate(scheme, envelope.payload, "test")


def test_references_off_stores_every_request_whole() -> None:
    recorder = _record(llm_request_references="off")
    pipeline = PayloadPipeline()
    for envelope in _llm(recorder.events):
        body = pipeline._reader.read(
            envelope.event_type, envelope.body_version, _inflated(envelope)
        )
        assert body["request_prefix"] is None


def test_a_reader_starting_mid_run_asks_for_the_event_it_lacks() -> None:
    calls = _llm(_record().events)
    with pytest.raises(RequestPrefixMissing, match=r"continues the request of llm.call \d+"):
        PayloadPipeline().unpack(calls[6])
    earlier = {e.sequence: e for e in calls[:6]}
    body = PayloadPipeline().unpack_in_run(calls[6], earlier)
    assert body["raw_request_json"] == _sent(12)[6]


@pytest.mark.parametrize("known", [False, True], ids=["alone", "true-request-known"])
def test_a_reference_to_another_request_fails_its_digest(known: bool) -> None:
    """Also when the reader is handed the true request (as replay hands the one the
    code made): the stored parts are not its parts, so it is rebuilt and checked."""
    calls = _llm(_record().events)
    reader = PayloadPipeline()
    true = [reader.unpack(e) for e in calls][5]["raw_request_json"]
    plain = PayloadPipeline()
    stored = plain._reader.read("llm.call", calls[5].body_version, _inflated(calls[5]))
    # Call 5 re-stored as if it continued call 3 rather than call 4.
    prefix = stored["request_prefix"]
    stored["request_prefix"] = {
        **prefix,
        "sequence": calls[3].sequence,
        "items": prefix["items"] - 2,
    }
    context = PayloadContext(calls[5].run_id, calls[5].sequence, calls[5].event_id, "t")
    repacked = plain.pack("llm.call", calls[5].body_version, stored, context)
    forged = replace(calls[5], payload=repacked.data, payload_encoding=repacked.encoding)
    pipeline = PayloadPipeline()
    for envelope in calls[:5]:
        pipeline.unpack(envelope)
    with pytest.raises(UndecodableMessage, match="does not match its recorded digest"):
        pipeline.unpack(forged, request=_known(true) if known else None)


def _known(text: str) -> SplitRequest:
    """The request of ``text`` as replay's request memo hands it over: its parts' texts."""
    return SplitRequest.of(json.loads(text))


def test_a_request_known_to_be_the_recorded_one_is_taken_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replay hands the reader the request the code just made; when the stored parts
    are its parts text for text, the reader takes it: nothing spliced or digested
    again, each body handed back as stored (the caller holds the whole request), and
    later references still rebuild from it."""
    calls = _llm(_record().events)
    reader = PayloadPipeline()
    expected = [reader.unpack(e) for e in calls]
    as_stored = [PayloadPipeline().unpack_as_stored(e) for e in calls]
    rebuilt = 0
    spliced = _request_prefix._spliced

    def counted(*args: Any) -> Any:
        nonlocal rebuilt
        rebuilt += 1
        return spliced(*args)

    monkeypatch.setattr(_request_prefix, "_spliced", counted)
    pipeline = PayloadPipeline()
    known = [_known(body["raw_request_json"]) for body in expected]
    taken = [pipeline.unpack(e, request=k) for e, k in zip(calls, known, strict=True)]
    assert taken == as_stored
    assert sum(b["request_prefix"] is not None for b in taken) >= len(calls) - 1
    assert [k.text() for k in known] == [b["raw_request_json"] for b in expected]
    assert rebuilt == 0
    # A reader given nothing for the later calls rebuilds them from the known ones.
    mixed = PayloadPipeline()
    firsts = [
        mixed.unpack(e, request=_known(b["raw_request_json"]))
        for e, b in zip(calls[:6], expected, strict=False)
    ]
    assert firsts == as_stored[:6]
    assert [mixed.unpack(e) for e in calls[6:]] == expected[6:]
    assert rebuilt == len(calls) - 6


def _mailing_agent(run: AgentRun, input: Any) -> Any:
    """``chat_agent`` whose user quotes an e-mail address: redaction fires every turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(input["turns"]):
        messages.append({"role": "user", "content": f"mail ann{turn}@example.com: why? " * 9})
        reply = run.llm(_reply, {"model": "m", "messages": messages}, provider="openai")
        messages.append(reply["choices"][0]["message"])
    return len(messages)


@pytest.mark.parametrize("agent", [chat_agent, _mailing_agent])
def test_replay_takes_the_recorded_requests_as_the_code_makes_them(
    monkeypatch: pytest.MonkeyPatch, agent: Any
) -> None:
    """Replay rebuilds no recorded request: each is the one the code just made (redacted
    the same way), and a request that changes is still caught."""
    recorder = MemoryRecorder()
    recorder.record(agent, RunSnapshot("c1", {"turns": 10}), agent_id="chat")
    if agent is _mailing_agent:
        assert all("ann" not in (e.payload or b"").decode("latin-1") for e in recorder.events)
    spliced = _request_prefix._spliced
    calls: list[int] = []
    monkeypatch.setattr(_request_prefix, "_spliced", lambda *a: calls.append(1) or spliced(*a))
    assert replay_run(recorder.events, agent).passed
    assert calls == []

    def changed(run: AgentRun, input: Any) -> Any:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(input["turns"]):
            question = "why not? " if turn == 6 else "why? "
            messages.append({"role": "user", "content": f"question {turn}: " + question * 40})
            reply = run.llm(_reply, {"model": "m", "messages": messages}, provider="openai")
            messages.append(reply["choices"][0]["message"])
            if turn == 0:
                messages[1]["edited"] = True  # as chat_agent does
        return None

    if agent is chat_agent:
        report = replay_run(recorder.events, changed)
        assert report.divergence is not None
        assert report.divergence.kind == "argument_mismatch"
        assert report.divergence.sequence == _llm(recorder.events)[6].sequence


def test_a_known_request_that_is_not_the_recorded_one_is_ignored() -> None:
    calls = _llm(_record().events)
    reader = PayloadPipeline()
    expected = [reader.unpack(e) for e in calls]
    pipeline = PayloadPipeline()
    for envelope, body in zip(calls, expected, strict=True):
        other = json.loads(body["raw_request_json"])
        other["messages"][0] = {"role": "system", "content": "another prompt"}
        assert pipeline.unpack(envelope, request=SplitRequest.of(other)) == body


def test_reexecute_and_export_get_the_whole_request() -> None:
    recorder = _record(turns=6)
    sent: list[str] = []

    def send(request: Any) -> dict[str, Any]:
        sent.append(canonical_text(request))
        return _reply(request)

    diffs = reexecute(recorder.events, send)
    assert [d.same for d in diffs] == [True] * 6
    assert sent == _sent(6)
    records = event_records(recorder.events, pipeline=PayloadPipeline())
    requests = [r["body"]["raw_request_json"] for r in records if r["event_type"] == "llm.call"]
    assert requests == _sent(6)


def test_sealed_payloads_are_compressed_first() -> None:
    sealing = PayloadPipeline(sealer=AesGcmSealer(OneKey()), compression="zstd")
    body = {"provider": "p", "model": "m", "request_params_json": "{}", "latency_ms": 1.0}
    body["raw_request_json"] = canonical_text({"messages": [{"content": "x" * 5000}]})
    recorded = _llm(_record(turns=1).events)[0]
    context = PayloadContext(
        recorded.run_id, recorded.sequence, recorded.event_id, recorded.tenant_id, data_key=KEY
    )
    sealed = sealing.pack("llm.call", 4, body, context)
    # Padded to a size bucket before sealing (schemas._padding): 12-byte nonce, 16-byte tag.
    assert sealed.encoding == with_compression(SEALED_ENCODING, "zstd-d1+pad1")
    assert sealed.encoding == "avro+zstd-d1+pad1+aes256gcm+aad2"
    assert len(sealed.data) < 1000
    assert len(sealed.data) - 28 == bucket(len(sealed.data) - 28 - 1)
    envelope = replace(
        recorded,
        body_version=4,
        payload=sealed.data,
        payload_encoding=sealed.encoding,
        key_id=KEY.key_id,
    )
    assert sealing.unpack(envelope)["raw_request_json"] == body["raw_request_json"]
    assert not is_plaintext(envelope)
    with pytest.raises(UndecodableMessage):  # a plaintext pipeline cannot open it
        PayloadPipeline().unpack(envelope)


def test_a_compressed_plaintext_body_in_a_sealed_run_is_refused() -> None:
    guard = SealedRunGuard()
    recorded = _record(turns=1).events[1]
    sealed = replace(recorded, key_id="dk", payload_encoding=SEALED_ENCODING)
    assert guard.refusal(sealed) is None
    forged = replace(
        sealed, sequence=sealed.sequence + 1, key_id=None, payload_encoding="avro+zstd-d1"
    )
    assert is_plaintext(forged)
    assert guard.refusal(forged) is not None


def _envelope(payload: bytes, encoding: str) -> Envelope:
    recorded = _record(turns=1).events[1]
    return replace(recorded, run_id="r", sequence=3, payload=payload, payload_encoding=encoding)


_ZSTD_FRAME = zstandard.ZstdCompressor().compress(bytes(range(256)) * 40)


@pytest.mark.parametrize(
    ("payload", "encoding", "message"),
    [
        (_ZSTD_FRAME[: len(_ZSTD_FRAME) // 2], "avro+zstd", "zstd payload is corrupt"),
        (b"not deflate", "avro+deflate", "deflate payload is corrupt"),
        (b"anything", "avro+zstd-d9", "shared dictionary 9, which this release does not have"),
        (b"anything", "avro+zstd-dx", "unknown payload compression 'zstd-dx'"),
        (zlib.compress(b"x")[:-3], "avro+deflate", "truncated"),
        (
            zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 1000),
            "avro+zstd",
            "does not say how large it inflates",
        ),
    ],
)
def test_hostile_compressed_payloads_are_refused_by_name(
    payload: bytes, encoding: str, message: str
) -> None:
    with pytest.raises(UndecodableMessage, match=message) as caught:
        PayloadPipeline().unpack(_envelope(payload, encoding))
    assert "run r sequence 3" in str(caught.value)


def test_a_compression_bomb_is_refused_before_it_inflates() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 5_000_000)
    deflated = zlib.compress(b"\0" * 5_000_000)
    assert len(bomb) < 1000
    assert len(deflated) < 10_000
    small = PayloadPipeline(max_body_bytes=1_000_000)
    with pytest.raises(UndecodableMessage, match="would inflate to 5000000 bytes"):
        small.unpack(_envelope(bomb, "avro+zstd"))
    with pytest.raises(UndecodableMessage, match="inflates past the 1000000-byte limit"):
        small.unpack(_envelope(deflated, "avro+deflate"))


def test_an_unknown_compression_setting_is_named() -> None:
    with pytest.raises(ValueError, match=r"BLACKBOX_PAYLOAD_COMPRESSION='lz4' is not one of"):
        Settings.from_env({"BLACKBOX_PAYLOAD_COMPRESSION": "lz4"})
    with pytest.raises(ValueError, match="BLACKBOX_LLM_REQUEST_REFERENCES='maybe'"):
        Settings(llm_request_references="maybe")
    for word, value in (("OFF", "off"), ("false", "off"), ("0", "off"), ("Yes", "on")):
        settings = Settings.from_env({"BLACKBOX_LLM_REQUEST_REFERENCES": word})
        assert settings.llm_request_references == value
    with pytest.raises(ValueError, match="payload compression 'brotli'"):
        PayloadPipeline(compression="brotli")


def test_a_v3_body_recorded_before_references_reads_whole() -> None:
    body = {
        "provider": "openai",
        "model": "m",
        "request_params_json": "{}",
        "raw_request_json": canonical_text({"model": "m", "messages": [{"content": "hi"}]}),
        "raw_response_json": None,
        "latency_ms": 3.0,
    }
    recorded = _llm(_record(turns=1).events)[0]
    context = PayloadContext(recorded.run_id, recorded.sequence, recorded.event_id, "t")
    old = PayloadPipeline(compression="none").pack("llm.call", 3, body, context)
    envelope = replace(recorded, body_version=3, payload=old.data, payload_encoding=old.encoding)
    read = PayloadPipeline().unpack(envelope)
    assert read["request_prefix"] is None
    assert read["raw_request_json"] == body["raw_request_json"]


def test_interleaved_conversations_each_name_their_own() -> None:
    def two_threads(run: AgentRun, input: Any) -> Any:
        threads: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        for turn in range(8):
            name = "ab"[turn % 2]
            threads[name].append({"role": "user", "content": f"{name}{turn} " * 80})
            reply = run.llm(_reply, {"model": name, "messages": threads[name]}, provider="p")
            threads[name].append(reply["choices"][0]["message"])
        return None

    recorder = MemoryRecorder()
    recorder.record(two_threads, RunSnapshot("c1", {}), agent_id="two")
    calls = _llm(recorder.events)
    pipeline = PayloadPipeline()
    stored = [
        pipeline._reader.read(e.event_type, e.body_version, _inflated(e))["request_prefix"]
        for e in calls
    ]
    # Each conversation continues its own previous call, two llm.calls back.
    assert [p["sequence"] if p else None for p in stored[2:]] == [e.sequence for e in calls[:-2]]
    assert replay_run(recorder.events, two_threads).passed


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("BLACKBOX_PAYLOAD_COMPRESSION", "lz4", "is not one of zstd, zstd-nodict, deflate, none"),
        ("BLACKBOX_PARTITIONS", "twelve", "is not an integer"),
        ("BLACKBOX_OTEL", "maybe", "is not on or off"),
        ("BLACKBOX_OTEL_CONTENT", "sometimes", "is not on or off"),
        ("BLACKBOX_LLM_REQUEST_REFERENCES", "perhaps", "is not on or off"),
    ],
)
def test_the_cli_names_a_bad_setting_and_exits_2(variable: str, value: str, said: str) -> None:
    result = CliRunner(env={variable: value}).invoke(main, ["stats"])
    assert result.exit_code == 2, result.output
    assert f"{variable}={value!r} {said}" in result.output
    assert "Traceback" not in result.output
