"""``blackbox export``: envelopes as JSON lines (metadata only unless bodies are asked for
with a purpose) and recorded conversations as a chat dataset. Runs are recorded in
memory and read from archives, so no service is needed."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agent_blackbox.broker import KafkaUnavailable
from agent_blackbox.cli import main
from agent_blackbox.cli.commands.export import export_command
from agent_blackbox.keystore import AesGcmSealer, KeystoreError
from agent_blackbox.outbox import AgentRun, MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import (
    ExportTally,
    ReadSide,
    chat_examples,
    event_records,
    json_line,
    write_archive,
)
from agent_blackbox.replayer._access import Opening
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    DataKey,
    Envelope,
    EventType,
    PayloadContext,
    PayloadPipeline,
    Settings,
    canonical_json,
    next_chain_hash,
)
from tests.integration._agents import large_reply

QUESTION = "What is the weather in Oslo? Write to jo.hansen@example.com"
PLACEHOLDER = "[redacted:email]"
HOSTILE = (
    "<script>alert(1)</script><img src=x onerror=alert(2)>"
    "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\\x1b[2J\x9b31m"
    "\u202egpj.exe\u2028second line\u2029third\x85fourth\x7f\U000e0041"
)
SYSTEM = "You answer weather questions."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
}
PURPOSE = "unit test of the export"


def _completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{finish}",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
    }


def weather_agent(run: AgentRun, input: Any) -> str:
    """Asks the model, which asks for a tool; sends the tool's result back; the model
    answers. The tool's result is hostile text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": input["question"]},
    ]
    asking = _completion({"role": "assistant", "content": None, "tool_calls": [CALL]}, "tool_calls")
    request = {
        "model": "gpt-test",
        "temperature": 0.2,
        "messages": messages,
        "tools": [WEATHER_TOOL],
    }
    first = run.llm(lambda _: asking, request, provider="openai")
    turn = dict(first["choices"][0]["message"])
    turn["refusal"] = None  # what an SDK's dump adds: not part of the chat format
    result = run.call("weather", lambda city: f"sunny in {city} {HOSTILE}", "Oslo")
    messages += [turn, {"role": "tool", "tool_call_id": "call_1", "content": result}]
    answer = _completion({"role": "assistant", "content": f"Sunny. {HOSTILE}"})
    second = run.llm(lambda _: answer, {**request, "messages": messages}, provider="openai")
    return str(second["choices"][0]["message"]["content"])


def _record(agent: Any, recorder: MemoryRecorder | None = None, **input: Any) -> list[Envelope]:
    recorder = recorder or MemoryRecorder()
    snapshot = RunSnapshot(code_version="export.1", input=input or {"question": QUESTION})
    run, _ = recorder.record(agent, snapshot, agent_id="weather")
    return [e for e in recorder.events if e.run_id == run.run_id]


@pytest.fixture(scope="module")
def recorded() -> list[Envelope]:
    return _record(weather_agent)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory, recorded: list[Envelope]) -> Path:
    path = tmp_path_factory.mktemp("export") / "runs.avro"
    write_archive(path, [*recorded, *_record(weather_agent, question="Rain in Bergen?")])
    return path


ENV = {
    "BLACKBOX_KEK": None,
    "BLACKBOX_KEK_FILE": None,
    "BLACKBOX_PURPOSE": None,
    # Nothing listens there: a test that reached the database would fail.
    "BLACKBOX_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/none",
}


def _export(*args: str, obj: Any = None) -> Result:
    command: Any = main if obj is None else export_command
    words = ["export", *args] if obj is None else list(args)
    return CliRunner(env=ENV).invoke(command, words, obj=obj)


def _lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.split("\n") if line]


# Metadata only, by default ----------------------------------------------------------


def test_the_default_export_is_envelope_metadata_with_no_body(
    archive: Path, recorded: list[Envelope]
) -> None:
    result = _export("--archive", str(archive), recorded[0].run_id)
    lines = _lines(result)
    assert [line["sequence"] for line in lines] == [e.sequence for e in recorded]
    for line, envelope in zip(lines, recorded, strict=True):
        assert "body" not in line
        assert line["event_id"] == envelope.event_id
        assert line["event_type"] == envelope.event_type
        assert line["chain_hash"] == envelope.chain_hash
        assert line["input_digest"] == envelope.input_digest
        assert line["attributes"] == envelope.attributes
        assert line["recorded_at"] == envelope.recorded_at.isoformat(timespec="microseconds")
    # Nothing of any body: not the question, not the tool's result, not the answer.
    for secret in ("Oslo?", "jo.hansen", "sunny", "Sunny", "script", SYSTEM):
        assert secret not in result.stdout
    assert "of 1 run (metadata only, no bodies) written to standard output" in result.stderr


def test_each_chain_hash_can_be_checked_from_the_exported_metadata_alone(
    recorded: list[Envelope],
) -> None:
    head = GENESIS_CHAIN_HASH
    for line in map(json.loads, map(json_line, event_records(recorded))):
        material = {k: v for k, v in line.items() if k not in ("payload_digest", "chain_hash")}
        material["payload"] = line["payload_digest"]
        at = datetime.fromisoformat(line["recorded_at"]) - datetime(1970, 1, 1, tzinfo=UTC)
        material["recorded_at"] = at // timedelta(microseconds=1)
        assert line["chain_hash"] == next_chain_hash(head, canonical_json(material))
        head = line["chain_hash"]


def test_an_archive_with_no_selection_exports_every_run(archive: Path) -> None:
    lines = _lines(_export("--archive", str(archive)))
    assert len({line["run_id"] for line in lines}) == 2


def test_bodies_are_exported_only_when_asked_for_with_a_purpose(recorded: list[Envelope]) -> None:
    records = list(event_records(recorded, pipeline=PayloadPipeline()))
    assert all(isinstance(r["body"], dict) for r in records)
    [first_call, _] = [r for r in records if r["event_type"] == EventType.LLM_CALL]
    assert PLACEHOLDER in first_call["body"]["raw_request_json"]
    assert "jo.hansen" not in json.dumps(records)


# The chat dataset -------------------------------------------------------------------


def test_a_conversation_with_tool_calls_and_results_is_one_example(
    recorded: list[Envelope],
) -> None:
    tally = ExportTally()
    [example] = chat_examples(recorded, PayloadPipeline(), tally=tally)
    messages = example["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[0] == {"role": "system", "content": SYSTEM}
    # The assistant turn that called the tool, as the agent sent it back (without the
    # SDK's null refusal), the tool's result as the agent sent it, then the answer.
    assert messages[2] == {"role": "assistant", "tool_calls": [CALL]}
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": f"sunny in Oslo {HOSTILE}",
    }
    assert messages[4] == {"role": "assistant", "content": f"Sunny. {HOSTILE}"}
    assert example["tools"] == [WEATHER_TOOL]
    calls = [e for e in recorded if e.event_type == EventType.LLM_CALL]
    metadata = example["metadata"]
    assert metadata["run_id"] == recorded[0].run_id
    assert metadata["sequences"] == [e.sequence for e in calls]
    assert metadata["sequence"] == calls[-1].sequence
    assert (metadata["model"], metadata["provider"], metadata["api"]) == (
        "gpt-test",
        "openai",
        "chat.completions",
    )
    assert metadata["parameters"] == {"temperature": 0.2}
    assert metadata["finish_reason"] == "stop"
    assert metadata["usage"]["total_tokens"] == 25
    assert (tally.examples, tally.llm_calls, sum(tally.skipped.values())) == (1, 2, 0)


def test_per_call_gives_each_llm_call_as_an_example(recorded: list[Envelope]) -> None:
    first, second = chat_examples(recorded, PayloadPipeline(), per_call=True)
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert first["messages"][-1] == {"role": "assistant", "tool_calls": [CALL]}
    assert len(second["messages"]) == 5
    assert first["metadata"]["sequences"] == [first["metadata"]["sequence"]]


def test_the_recorders_redaction_placeholder_is_kept_verbatim(recorded: list[Envelope]) -> None:
    [example] = chat_examples(recorded, PayloadPipeline())
    assert example["messages"][1]["content"] == QUESTION.replace(
        "jo.hansen@example.com", PLACEHOLDER
    )


def test_hostile_text_is_data_and_never_breaks_a_line(archive: Path) -> None:
    result = _export(
        "--archive", str(archive), "--format", "openai-chat", "--bodies", "--purpose", PURPOSE
    )
    assert result.exit_code == 0, result.output
    # One example per run, one line each, however a reader splits lines.
    assert len(result.stdout.splitlines()) == 2
    assert result.stdout.count("\n") == 2
    for raw in ("\x1b", "\x9b", "\x85", "\x7f", "\u2028", "\u2029", "\u202e", "\U000e0041"):
        assert raw not in result.stdout
    examples = [json.loads(line) for line in result.stdout.splitlines()]
    # Read back, the text is exactly what was recorded, markup and escapes included.
    assert examples[0]["messages"][3]["content"] == f"sunny in Oslo {HOSTILE}"
    assert examples[0]["messages"][4]["content"] == f"Sunny. {HOSTILE}"
    assert "<script>alert(1)</script>" in result.stdout  # JSON data, as it was written
    assert "2 examples (one per conversation) from 4 LLM calls in 2 runs" in result.stderr


def test_json_lines_escape_separators_and_invisible_characters_and_drop_non_finite() -> None:
    value = {
        "text": "a\u2028b\u2029c\x85d\x9b\u200be\ud800f\U000e0001",
        "n": float("nan"),
        "inf": [float("inf"), 1.5],
        "raw": b"\x00\xff",
    }
    line = json_line(value)
    assert line.isascii() or all(ord(c) < 0xD800 for c in line)
    assert len(line.splitlines()) == 1
    assert "NaN" not in line
    assert "Infinity" not in line
    back = json.loads(line)
    assert back == {"text": value["text"], "n": None, "inf": [None, 1.5], "raw": "AP8="}
    assert json_line({"k": "æøå 東京"}) == '{"k":"æøå 東京"}'  # printable text as it is


def test_a_truncated_call_is_skipped_and_counted() -> None:
    settings = Settings(
        blob_threshold_bytes=1_000, max_blob_bytes=100_000, payload_compression="none"
    )
    recorder = MemoryRecorder(settings=settings)

    def agent(run: AgentRun, input: Any) -> Any:
        request = {"model": "m", "messages": [{"role": "user", "content": "summarise"}]}
        run.llm(lambda _: large_reply(500_000), request, provider="test", model="m")
        run.llm(
            lambda _: _completion({"role": "assistant", "content": "ok"}), request, provider="test"
        )
        return "done"

    events = _record(agent, recorder)
    [call, _] = [e for e in events if e.event_type == EventType.LLM_CALL]
    assert call.attributes["body_truncated"] == "true"
    tally = ExportTally()
    examples = list(chat_examples(events, PayloadPipeline(), blobs=recorder, tally=tally))
    assert [e["messages"][-1]["content"] for e in examples] == ["ok"]
    assert tally.skipped == {"truncated": 1}


def test_a_failed_call_is_skipped_and_counted_in_the_summary(tmp_path: Path) -> None:
    def agent(run: AgentRun, input: Any) -> Any:
        def refused(_request: Any) -> Any:
            raise ConnectionError("model unreachable")

        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        with contextlib.suppress(ConnectionError):
            run.llm(refused, request, provider="test")
        run.llm(
            lambda _: _completion({"role": "assistant", "content": "hi"}), request, provider="test"
        )
        return "done"

    path = tmp_path / "failed.avro"
    write_archive(path, _record(agent))
    result = _export(
        "--archive", str(path), "--format", "openai-chat", "--bodies", "--purpose", PURPOSE
    )
    assert [e["messages"][-1]["content"] for e in _lines(result)] == ["hi"]
    assert "skipped 1 LLM call: 1 failed" in result.stderr


def test_a_streamed_reply_is_assembled_from_its_chunks() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "s", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    stream = [
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"tool_calls": [{"index": 0, **CALL, "function": {"name": "weather"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}]}),
        chunk({}, "tool_calls"),
    ]

    def agent(run: AgentRun, input: Any) -> Any:
        request = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        return run.llm(lambda _: {"stream": stream}, request, provider="openai")["stream"][0]["id"]

    [example] = chat_examples(_record(agent), PayloadPipeline())
    assert example["messages"][-1] == {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [CALL],
    }
    assert example["metadata"]["streamed"] is True
    assert "tools" not in example  # none were offered


def test_a_responses_api_conversation_becomes_chat_messages() -> None:
    tool = {"type": "function", "name": "weather", "parameters": {"type": "object"}}

    def response(rid: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": rid, "object": "response", "status": "completed", "output": output}

    call_item = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"}
    text_item = {"type": "message", "content": [{"type": "output_text", "text": "Sunny."}]}

    def agent(run: AgentRun, input: Any) -> Any:
        first = {
            "model": "m",
            "instructions": SYSTEM,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Oslo?"}]}],
            "tools": [tool],
        }
        run.llm(lambda _: response("resp_1", [call_item]), first, provider="openai")
        second = {
            "model": "m",
            "instructions": SYSTEM,
            "previous_response_id": "resp_1",
            "input": [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
            "tools": [tool],
        }
        run.llm(lambda _: response("resp_2", [text_item]), second, provider="openai")
        return "done"

    [example] = chat_examples(_record(agent), PayloadPipeline())
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    assert example["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    function = {"name": "weather", "parameters": {"type": "object"}}
    assert example["tools"] == [{"type": "function", "function": function}]
    assert example["metadata"]["api"] == "responses"


# Sealed runs --------------------------------------------------------------------------

KEY = DataKey("dk-export", os.urandom(32))
FORGED = "FORGED-CLEAR-BODY-2231"


class _OneKey:
    def opening_key(self, run_id: str, key_id: str) -> bytes:
        if key_id != KEY.key_id:
            raise KeystoreError(f"run {run_id} key {key_id}: unknown")
        return KEY.secret


def _sealed_with_a_forged_finish(events: list[Envelope]) -> list[Envelope]:
    """``events`` sealed under :data:`KEY` as an encrypting recorder writes them, but the
    last (``run.finished``) replaced by a plaintext one someone else appended."""
    plain, sealing = PayloadPipeline(), PayloadPipeline(sealer=AesGcmSealer())
    out, head = [], GENESIS_CHAIN_HASH
    for e in events:
        body = plain.unpack(e)
        context = PayloadContext(e.run_id, e.sequence, e.event_id, e.tenant_id, data_key=KEY)
        if e is events[-1]:
            body["output_json"] = json.dumps(FORGED)
            packed = plain.pack(e.event_type, e.body_version, body, replace(context, data_key=None))
        else:
            packed = sealing.pack(e.event_type, e.body_version, body, context)
        e = replace(e, payload=packed.data, key_id=packed.key_id, payload_encoding=packed.encoding)
        e = replace(e, chain_hash=e.expected_chain_hash(head))
        out.append(e)
        head = e.chain_hash
    return out


def test_a_body_that_does_not_open_is_null_and_the_export_exits_1(
    recorded: list[Envelope], tmp_path: Path
) -> None:
    events = list(recorded)
    at = next(i for i, e in enumerate(events) if e.event_type == "llm.call")
    events[at] = replace(events[at], payload=b"not zstd", payload_encoding="avro+zstd-d1")
    path = tmp_path / "damaged.avro"
    write_archive(path, events)
    result = _export("--archive", str(path), "--bodies", "--purpose", PURPOSE)
    assert result.exit_code == 1, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == len(events)  # every event written, the others with their bodies
    assert lines[at]["body"] is None
    assert "zstd payload is corrupt" in lines[at]["body_unavailable"]
    # The next call's request was stored against the damaged one: it cannot be rebuilt.
    unopened = [line for line in lines if line["body"] is None]
    assert len(unopened) == 2
    assert "whose body did not open (UndecodableMessage)" in unopened[1]["body_unavailable"]
    assert "2 bodies could not be opened" in result.stderr


def test_a_plaintext_body_in_a_sealed_run_is_refused_not_exported(
    recorded: list[Envelope], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _sealed_with_a_forged_finish(recorded)
    tally = ExportTally()
    pipeline = PayloadPipeline(sealer=AesGcmSealer(_OneKey()))
    records = list(event_records(events, pipeline=pipeline, tally=tally))
    assert all(r["body"] is not None for r in records[:-1])  # the genuine sealed bodies
    assert records[-1]["body"] is None
    assert records[-1]["body_unavailable"].startswith("refused: ")
    assert FORGED not in json.dumps(records)
    assert tally.refused == 1
    # The chat export refuses it too, and the command exits 1: a finding.
    assert list(chat_examples(events, pipeline, tally=ExportTally()))
    path = tmp_path / "sealed.avro"
    write_archive(path, events)
    result = _export("--archive", str(path), "--bodies", "--purpose", PURPOSE)
    assert result.exit_code == 2, result.output  # no key-encryption key configured here
    assert "sealed and no key-encryption key is configured" in result.stderr
    assert "BLACKBOX_KEK_FILE" in result.stderr
    assert not result.stdout
    # With the run's key, the genuine bodies are exported, the forged one refused: exit 1.
    keyed = Opening(pipeline)
    monkeypatch.setattr("agent_blackbox.cli.commands.export.opening", lambda *_a, **_k: keyed)
    result = _export("--archive", str(path), "--bodies", "--purpose", PURPOSE)
    assert result.exit_code == 1, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["body"] is None for line in lines] == [False] * (len(events) - 1) + [True]
    assert FORGED not in result.stdout
    assert "1 body refused" in result.stderr
    assert f"sequence {events[-1].sequence} carries a plaintext body" in result.stderr


# What the command refuses, and how it fails ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--format", "openai-chat", "RUN"], "--format openai-chat writes the recorded"),
        (["--bodies", "RUN"], "--bodies reads recorded content: give --purpose"),
        (["--bodies", "--purpose", "x", "RUN"], "too short"),
        (["--purpose", "audit\nforged line", "--bodies", "RUN"], "control character"),
        ([], "give the RUN_IDs to export, or select runs with --since"),
        (["--since", "yesterday"], "give a span back from now"),
        (["--agent", "a"], "need --since"),
        (["--since", "1h", "RUN"], "not both"),
        (["--since", "1h", "--until", "2h"], "--until is not after --since"),
        (["--examples", "call", "RUN"], "--examples goes with --format openai-chat"),
    ],
)
def test_bad_options_exit_2_saying_what_to_do(args: list[str], said: str) -> None:
    result = _export(*args)
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_an_unknown_run_in_an_archive_exits_2_and_leaves_the_output_file_alone(
    archive: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text("kept\n")
    result = _export("--archive", str(archive), "no-such-run", "--output", str(output))
    assert result.exit_code == 2, result.output
    assert "runs not in archive" in result.stderr
    assert "no-such-run" in result.stderr
    assert output.read_text() == "kept\n"
    assert list(tmp_path.iterdir()) == [output]  # no partial file left beside it


def test_the_output_file_is_owner_only_and_whole(archive: Path, tmp_path: Path) -> None:
    output = tmp_path / "dataset.jsonl"
    result = _export("--archive", str(archive), "--output", str(output))
    assert result.exit_code == 0, result.output
    assert not result.stdout
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    assert len(output.read_text().splitlines()) == 10  # both runs, five events each
    assert f"written to {output}" in result.stderr


@dataclass(frozen=True)
class _Located:
    run_id: str
    agent_id: str | None = "weather"
    topic: str = "blackbox.events"
    partition: int = 0
    first_offset: int = 0
    last_offset: int = 4
    events: int = 5
    unverified: frozenset[int] = frozenset()


class _Index:
    """A run index that knows one run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def locate(self, run_id: str) -> _Located | None:
        return _Located(run_id) if run_id == self.run_id else None

    def runs(self, **_filters: Any) -> list[str]:
        return []

    def granted_epochs(self) -> None:
        return None

    def checkpoint(self, run_id: str) -> None:
        return None


def test_a_run_the_index_does_not_know_exits_2_naming_it() -> None:
    side = ReadSide(run_index=lambda _engine: _Index("known"))
    result = _export("known", "unknown", obj=side)
    assert result.exit_code == 2, result.output
    assert "run unknown is not in the events index" in result.stderr
    assert "nothing was written" in result.stderr


def test_since_matching_nothing_exits_2_with_the_filter() -> None:
    side = ReadSide(run_index=lambda _engine: _Index("known"))
    result = _export("--since", "1h", "--agent", "weather", obj=side)
    assert result.exit_code == 2, result.output
    assert "nothing matched in the run index" in result.stderr
    assert "of agent 'weather'" in result.stderr


def test_kafka_down_exits_2_with_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*_args: Any, **_kwargs: Any) -> Any:
        yield from ()  # a generator, as the real reader: it fails once read
        raise KafkaUnavailable("reading blackbox.events stalled for 60s; is the broker up?")

    monkeypatch.setattr("agent_blackbox.replayer._sources.read_ranges", down)
    side = ReadSide(run_index=lambda _engine: _Index("known"))
    result = _export("known", obj=side)
    assert result.exit_code == 2, result.output
    assert "run known: cannot read blackbox.events[0]" in result.stderr
    assert "is the broker up?" in result.stderr
