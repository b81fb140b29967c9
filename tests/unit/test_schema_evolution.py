"""Schema evolution: migrators, Avro resolution, unknown versions, ``schemas check``."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent_blackbox.cli.commands.schemas import check_directory, schemas_group
from agent_blackbox.examples.ticket_agent import (
    KeywordModel,
    Notifier,
    TicketAgent,
    replay_entry,
    sample_tickets,
)
from agent_blackbox.outbox import AgentRun, MemoryRecorder
from agent_blackbox.outbox._boundaries import recorded_output
from agent_blackbox.outbox._llm import llm_call
from agent_blackbox.replayer import DivergenceKind, read_archive, replay_run
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    LLM_CALL_VERSION,
    BodyCodec,
    BodyReader,
    Envelope,
    EventType,
    MigrationFailed,
    MigratorRegistry,
    PayloadPipeline,
    SchemaRegistry,
    Step,
    UnknownSchemaVersion,
    default_migrators,
    default_registry,
    digest,
    incompatibilities,
    llm_call_v1_to_v2,
    llm_reply,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v1.avro"
GOLDEN_EVENTS = list(read_archive(GOLDEN))
GOLDEN_RUNS = [list(g) for _, g in groupby(GOLDEN_EVENTS, key=lambda e: e.run_id)]
GOLDEN_LLM_CALLS = [e for e in GOLDEN_EVENTS if e.event_type == EventType.LLM_CALL]
GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v2.avro"
GOLDEN_V2_EVENTS = list(read_archive(GOLDEN_V2))
GOLDEN_V2_RUNS = [list(g) for _, g in groupby(GOLDEN_V2_EVENTS, key=lambda e: e.run_id)]
GOLDEN_V2_LLM_CALLS = [e for e in GOLDEN_V2_EVENTS if e.event_type == EventType.LLM_CALL]


def _record(name: str, fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "test.body", "fields": fields}


def _write(directory: Path, event_type: str, version: int, schema: dict[str, Any]) -> None:
    (directory / f"{event_type}.v{version}.avsc").write_text(json.dumps(schema))


# A toy event type whose history has every kind of step:
#   v1 → v2  migrator  (``name`` split into ``first`` and ``last``)
#   v2 → v3  additive  (``age`` with a default)
#   v3 → v4  additive  (``tags`` with a default), collapses with v2 → v3 into one decode
#   v4 → v5  migrator  (``age`` becomes ``birth_year``)
_PERSON = {
    1: [{"name": "name", "type": "string"}],
    2: [{"name": "first", "type": "string"}, {"name": "last", "type": "string"}],
    3: [
        {"name": "first", "type": "string"},
        {"name": "last", "type": "string"},
        {"name": "age", "type": "int", "default": 40},
    ],
    4: [
        {"name": "first", "type": "string"},
        {"name": "last", "type": "string"},
        {"name": "age", "type": "long", "default": 40},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
    5: [
        {"name": "first", "type": "string"},
        {"name": "last", "type": "string"},
        {"name": "birth_year", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


def _split_name(body: Any) -> dict[str, Any]:
    first, _, last = body["name"].partition(" ")
    return {"first": first, "last": last}


def _age_to_birth_year(body: Any) -> dict[str, Any]:
    migrated = {k: v for k, v in body.items() if k != "age"}
    migrated["birth_year"] = 2026 - body["age"]
    return migrated


def _person_migrators() -> MigratorRegistry:
    migrators = MigratorRegistry()
    migrators.add("person", 1, _split_name)
    migrators.register("person", 4)(_age_to_birth_year)
    return migrators


@pytest.fixture
def people(tmp_path: Path) -> tuple[BodyCodec, BodyReader]:
    for version, fields in _PERSON.items():
        _write(tmp_path, "person", version, _record("Person", fields))
    codec = BodyCodec(SchemaRegistry.from_directory(tmp_path))
    return codec, BodyReader(codec, _person_migrators())


# Migrator chaining -----------------------------------------------------------------


def test_migrators_and_resolution_chain_from_v1_to_the_newest(
    people: tuple[BodyCodec, BodyReader],
) -> None:
    codec, reader = people
    stored = codec.encode("person", 1, {"name": "Ada Lovelace"})
    assert reader.path("person", 1, 5) == (
        Step("migrate", 1, 2),
        Step("resolve", 2, 4),
        Step("migrate", 4, 5),
    )
    body = reader.read("person", 1, stored)
    assert body == {"first": "Ada", "last": "Lovelace", "birth_year": 1986, "tags": []}
    assert stored == codec.encode("person", 1, {"name": "Ada Lovelace"})  # never rewritten


def test_a_body_is_read_at_the_version_asked_for(people: tuple[BodyCodec, BodyReader]) -> None:
    codec, reader = people
    stored = codec.encode("person", 1, {"name": "Ada Lovelace"})
    assert reader.read("person", 1, stored, to=2) == {"first": "Ada", "last": "Lovelace"}
    assert reader.read("person", 1, stored, to=3)["age"] == 40
    written_v3 = codec.encode("person", 3, {"first": "A", "last": "B", "age": 7})
    assert reader.read("person", 3, written_v3)["birth_year"] == 2019  # int promoted to long
    assert reader.read("person", 3, written_v3, to=3) == {"first": "A", "last": "B", "age": 7}


def test_upgrade_of_a_decoded_body_leaves_it_unchanged(
    people: tuple[BodyCodec, BodyReader],
) -> None:
    _, reader = people
    original = {"name": "Grace Hopper"}
    assert reader.upgrade("person", 1, original)["birth_year"] == 1986
    assert original == {"name": "Grace Hopper"}


def test_a_failing_migrator_names_its_step(people: tuple[BodyCodec, BodyReader]) -> None:
    codec, _ = people
    migrators = MigratorRegistry()
    migrators.add("person", 1, lambda body: {"first": body["no such field"]})
    reader = BodyReader(codec, migrators)
    with pytest.raises(MigrationFailed, match="person v1 body does not migrate to v2"):
        reader.read("person", 1, codec.encode("person", 1, {"name": "x"}), to=2)


def test_a_step_has_one_migrator() -> None:
    migrators = default_migrators()
    assert migrators.steps() == (
        ("effect.receipt", 1),
        ("llm.call", 1),
        ("run.finished", 1),
        ("run.started", 1),
        ("tool.call", 1),
    )
    with pytest.raises(ValueError, match="already has a migrator"):
        migrators.add("llm.call", 1, llm_call_v1_to_v2)


# llm.call v2 -----------------------------------------------------------------------

_V1_BODY = {
    "provider": "openai",
    "model": "gpt-x",
    "request_params_json": "{}",
    "raw_request_json": '{"model":"gpt-x"}',
    "raw_response_json": json.dumps(
        {"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 6}}}
    ),
    "response_id": "r1",
    "choices": [],
    "tool_calls": [
        {"id": "c1", "name": "lookup", "arguments_json": '{ "q" : "x", "a": 1 }'},
        {"id": "c2", "name": "broken", "arguments_json": '{"q": '},
    ],
    "finish_reason": "tool_calls",
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    "latency_ms": 3.5,
    "error": None,
}


def test_llm_call_v1_migrates_to_v2_usage_and_normalised_tool_calls() -> None:
    before = json.dumps(_V1_BODY, sort_keys=True)
    body = llm_call_v1_to_v2(_V1_BODY)
    assert json.dumps(_V1_BODY, sort_keys=True) == before  # pure: the input is untouched
    assert body["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cached_tokens": 6,  # recovered from the raw response the v1 body kept
        "total_tokens": 15,
    }
    assert body["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "name": "lookup",
            "arguments_json": '{"a":1,"q":"x"}',
            "arguments_raw": None,
        },
        {
            "id": "c2",
            "type": "function",
            "name": "broken",
            "arguments_json": None,
            "arguments_raw": '{"q": ',
        },
    ]
    BodyCodec().encode("llm.call", 2, body)  # fits the v2 schema


def test_v1_bytes_read_as_v2_through_the_pipeline() -> None:
    codec = BodyCodec()
    stored = codec.encode("llm.call", 1, _V1_BODY)
    assert BodyReader().read("llm.call", 1, stored, to=2) == llm_call_v1_to_v2(_V1_BODY)
    assert BodyReader().read("llm.call", 1, stored, to=1) == codec.decode("llm.call", 1, stored)


def test_every_golden_llm_call_decodes_to_the_newest_body() -> None:
    assert len(GOLDEN_LLM_CALLS) == 5
    assert default_registry().latest("llm.call").version == LLM_CALL_VERSION == 4
    pipeline, codec = PayloadPipeline(), BodyCodec()
    for envelope in GOLDEN_LLM_CALLS:
        assert envelope.body_version == 1
        assert envelope.payload is not None
        v1 = codec.decode("llm.call", 1, envelope.payload)
        v2 = pipeline.unpack(envelope, version=2)
        assert v2 == llm_call_v1_to_v2(v1)
        codec.encode("llm.call", 2, v2)  # a valid v2 body
        assert v2["usage"]["input_tokens"] == v1["usage"]["prompt_tokens"]
        assert v2["usage"]["output_tokens"] == v1["usage"]["completion_tokens"]
        assert v2["usage"]["cached_tokens"] == 0
        v3 = pipeline.unpack(envelope)
        codec.encode("llm.call", LLM_CALL_VERSION, v3)  # a valid body of the newest version
        assert v3["request_prefix"] is None  # stored whole
        assert "choices" not in v3
        assert "tool_calls" not in v3
        assert v3["raw_response_json"] == v1["raw_response_json"]
        assert v3["usage"] == v2["usage"]
        assert v3["body_truncated"] is None
        # What v1 stored beside the raw response is what is derived from it now.
        reply = llm_reply(v3)
        assert list(reply.choices) == v1["choices"] == v2["choices"]
        assert list(reply.tool_calls) == v2["tool_calls"]
        # The output digest is over the raw response, so it holds for every version.
        assert digest(recorded_output(envelope.event_type, v3)) == envelope.output_digest
        assert pipeline.unpack(envelope, version=1) == v1


def test_every_golden_v2_llm_call_reads_as_v3_with_the_same_view() -> None:
    assert len(GOLDEN_V2_LLM_CALLS) == 5
    pipeline, codec = PayloadPipeline(), BodyCodec()
    for envelope in GOLDEN_V2_LLM_CALLS:
        assert envelope.body_version == 2
        assert envelope.payload is not None
        v2 = codec.decode("llm.call", 2, envelope.payload)
        v3 = pipeline.unpack(envelope)
        assert {k: v for k, v in v3.items() if k not in ("body_truncated", "request_prefix")} == {
            k: v for k, v in v2.items() if k not in ("choices", "tool_calls")
        }
        reply = llm_reply(v3)
        assert (list(reply.choices), list(reply.tool_calls)) == (v2["choices"], v2["tool_calls"])
        assert digest(recorded_output(envelope.event_type, v3)) == envelope.output_digest


_V2_BODY_WITH_ERROR_AND_TOOL_CALLS = {
    **llm_call_v1_to_v2(_V1_BODY),
    "raw_response_json": json.dumps(
        {
            "id": "r1",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {
                                    "name": "lookup",
                                    "arguments": '{ "q" : "x", "a": 1 }',
                                },
                            },
                            {
                                "id": "c2",
                                "type": "function",
                                "function": {"name": "broken", "arguments": '{"q": '},
                            },
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
        }
    ),
    "error": {"type": "APITimeoutError", "message": "timed out"},
}


def test_a_v2_body_with_tool_calls_and_an_error_reads_as_v3() -> None:
    v2 = _V2_BODY_WITH_ERROR_AND_TOOL_CALLS
    v3 = BodyReader().read("llm.call", 2, BodyCodec().encode("llm.call", 2, v2))
    assert v3["error"] == {
        "type": "APITimeoutError",
        "message": "timed out",
        "module": None,
        "args_json": None,
        "kind": None,
    }
    assert list(llm_reply(v3).tool_calls) == v2["tool_calls"]
    # The error handed back in replay is the one recorded (and digested): no null keys.
    recorded = recorded_output("llm.call", v3)
    assert recorded["error"] == {"type": "APITimeoutError", "message": "timed out"}
    assert digest(recorded) == digest(recorded_output("llm.call", v2))


@pytest.mark.parametrize("index", range(len(GOLDEN_RUNS)))
def test_golden_v1_runs_replay_after_v2_exists(index: int) -> None:
    report = replay_run(GOLDEN_RUNS[index], replay_entry)
    assert report.passed, report.divergence and report.divergence.describe()


@pytest.mark.parametrize("index", range(len(GOLDEN_V2_RUNS)))
def test_golden_v2_runs_replay_after_v3_exists(index: int) -> None:
    report = replay_run(GOLDEN_V2_RUNS[index], replay_entry)
    assert report.passed, report.divergence and report.divergence.describe()


def test_the_recorder_writes_the_newest_llm_call_with_cached_tokens() -> None:
    response = {
        "id": "x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 2,
            "total_tokens": 22,
            "prompt_tokens_details": {"cached_tokens": 16},
        },
    }
    crossing = llm_call(
        provider="openai", model="m", request={}, response=response, error=None, latency_ms=1.0
    )
    assert crossing.version == LLM_CALL_VERSION
    assert crossing.body["usage"]["cached_tokens"] == 16
    assert crossing.attributes["cached_tokens"] == "16"
    assert crossing.attributes["prompt_tokens"] == "20"  # v1 attribute names kept
    BodyCodec().encode("llm.call", LLM_CALL_VERSION, crossing.body)


def test_a_run_recorded_with_the_newest_llm_call_replays() -> None:
    recorder = MemoryRecorder()
    agent = TicketAgent(sample_tickets(1), KeywordModel(), Notifier())
    recorder.record(agent.run, agent.snapshot("T-00000"), agent_id="ticket-agent")
    versions = {e.body_version for e in recorder.events if e.event_type == EventType.LLM_CALL}
    assert versions == {LLM_CALL_VERSION}
    assert replay_run(recorder.events, replay_entry, blobs=recorder).passed


# Unknown versions ------------------------------------------------------------------


def _claiming(version: int, events: list[Envelope]) -> list[Envelope]:
    """``events`` with their llm.call claiming ``version``, the chain re-linked as a
    writer of that version would have linked it."""
    head, out = GENESIS_CHAIN_HASH, []
    for envelope in events:
        if envelope.event_type == EventType.LLM_CALL:
            envelope = replace(envelope, body_version=version)
        envelope = replace(envelope, chain_hash=envelope.expected_chain_hash(head))
        head = envelope.chain_hash
        out.append(envelope)
    return out


def _names_type_and_version(error: UnknownSchemaVersion) -> None:
    assert (error.event_type, error.version) == ("llm.call", 9)
    assert "'llm.call' version 9" in str(error)
    assert "known versions: 1, 2" in str(error)
    assert "upgrade agent-blackbox" in str(error)


def test_unknown_version_is_a_clear_error_from_codec_and_pipeline() -> None:
    envelope = replace(GOLDEN_LLM_CALLS[0], body_version=9)
    with pytest.raises(UnknownSchemaVersion) as from_codec:
        BodyCodec().decode("llm.call", 9, b"")
    _names_type_and_version(from_codec.value)
    with pytest.raises(UnknownSchemaVersion) as from_pipeline:
        PayloadPipeline().unpack(envelope)
    _names_type_and_version(from_pipeline.value)
    with pytest.raises(UnknownSchemaVersion, match=r"'no\.such\.type' version 1"):
        BodyReader().read("no.such.type", 1, b"")


def test_unknown_version_stops_the_replay_instead_of_calling_it_tampering() -> None:
    report = replay_run(_claiming(9, GOLDEN_RUNS[0]), replay_entry)
    assert report.result == "ERROR"
    assert report.divergence is None
    assert report.error is not None
    assert report.error.startswith("UnknownSchemaVersion: ")
    for part in ("'llm.call' version 9", "known versions: 1, 2", "upgrade agent-blackbox"):
        assert part in report.error


def test_unknown_version_stops_the_replay_even_when_the_agent_catches_it() -> None:
    def forgiving(run: AgentRun, input: Any) -> Any:
        try:
            return replay_entry(run, input)
        except Exception:
            return None  # agent code that swallows every error must not hide it

    report = replay_run(_claiming(9, GOLDEN_RUNS[0]), forgiving)
    assert report.result == "ERROR"
    assert report.error is not None
    assert "version 9" in report.error


def test_a_forged_body_version_is_a_broken_chain() -> None:
    events = [
        replace(e, body_version=9) if e.event_type == EventType.LLM_CALL else e
        for e in GOLDEN_RUNS[0]
    ]
    report = replay_run(events, replay_entry)
    assert report.divergence is not None
    assert report.divergence.kind == DivergenceKind.BROKEN_CHAIN


def test_a_gap_no_migrator_covers_names_the_step_and_the_field(tmp_path: Path) -> None:
    _write(tmp_path, "person", 1, _record("Person", _PERSON[1]))
    _write(tmp_path, "person", 2, _record("Person", _PERSON[2]))
    codec = BodyCodec(SchemaRegistry.from_directory(tmp_path))
    reader = BodyReader(codec, MigratorRegistry())
    with pytest.raises(UnknownSchemaVersion) as gap:
        reader.read("person", 1, codec.encode("person", 1, {"name": "x"}))
    message = str(gap.value)
    assert "'person' version 1" in message
    assert "v2 cannot read v1" in message
    assert "Person.first" in message
    assert "register a migrator for ('person', 1)" in message
    with pytest.raises(UnknownSchemaVersion, match="cannot be read as v1"):
        reader.read("person", 2, codec.encode("person", 2, {"first": "a", "last": "b"}), to=1)


# The compatibility rules -----------------------------------------------------------


def _field(name: str, schema: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": schema, **extra}


@pytest.mark.parametrize(
    ("writer", "reader", "ok"),
    [
        ("int", "long", True),
        ("int", "double", True),
        ("long", "float", True),
        ("float", "double", True),
        ("string", "bytes", True),
        ("bytes", "string", True),
        ("long", "int", False),
        ("double", "float", False),
        ("string", "int", False),
        ("string", ["null", "string"], True),
        (["null", "string"], "string", False),
        (["null", "int"], ["null", "long"], True),
        (["null", "string", "int"], ["null", "string"], False),
        ({"type": "array", "items": "int"}, {"type": "array", "items": "long"}, True),
        ({"type": "map", "values": "long"}, {"type": "map", "values": "int"}, False),
    ],
)
def test_primitive_promotions_unions_and_containers(writer: Any, reader: Any, ok: bool) -> None:
    wrap: Callable[[Any], dict[str, Any]] = lambda t: _record("R", [_field("f", t)])  # noqa: E731
    assert (not incompatibilities(wrap(reader), wrap(writer))) is ok


def test_record_rules() -> None:
    writer = _record("R", [_field("a", "string"), _field("gone", "int")])
    assert not incompatibilities(_record("R", [_field("a", "string")]), writer)  # removed
    added = _record("R", [_field("a", "string"), _field("b", "int")])
    (issue,) = incompatibilities(added, writer)
    assert issue.path == "R.b"
    assert "without a default" in issue.reason
    defaulted = _record("R", [_field("a", "string"), _field("b", "int", default=0)])
    assert not incompatibilities(defaulted, writer)
    aliased = _record("R", [_field("renamed", "string", aliases=["a"])])
    assert not incompatibilities(aliased, writer)
    (renamed,) = incompatibilities(_record("Other", [_field("a", "string")]), writer)
    assert "record R is read as Other" in renamed.reason
    nested_writer = _record("Outer", [_field("inner", _record("Inner", [_field("x", "int")]))])
    nested_reader = _record("Outer", [_field("inner", _record("Inner", [_field("x", "string")]))])
    (nested,) = incompatibilities(nested_reader, nested_writer)
    assert nested.path == "Outer.inner.x"


def test_enum_and_fixed_rules() -> None:
    def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
        kind = {"type": "enum", "name": "E", "symbols": list(symbols), **extra}
        return _record("R", [_field("e", kind)])

    assert not incompatibilities(enum("A", "B", "C"), enum("A", "B"))
    (issue,) = incompatibilities(enum("A"), enum("A", "B"))
    assert "symbols B" in issue.reason
    assert not incompatibilities(enum("A", "X", default="X"), enum("A", "B"))

    def fixed(size: int) -> dict[str, Any]:
        return _record("R", [_field("h", {"type": "fixed", "name": "H", "size": size})])

    assert not incompatibilities(fixed(16), fixed(16))
    assert incompatibilities(fixed(32), fixed(16))


def test_named_references_and_recursive_records() -> None:
    node = _record("Node", [_field("v", "int"), _field("next", ["null", "test.body.Node"])])
    wider = _record("Node", [_field("v", "long"), _field("next", ["null", "test.body.Node"])])
    assert not incompatibilities(wider, node)
    assert incompatibilities(node, wider)


# blackbox schemas check ------------------------------------------------------------


def test_schemas_check_passes_on_the_shipped_schemas() -> None:
    result = CliRunner().invoke(schemas_group, ["check"])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output
    report = check_directory()
    assert ("llm.call", 2, 1) in report.migrated


def _incompatible_set(directory: Path) -> None:
    # v2 adds ``b`` with a default, so it reads v1; v3 makes ``b`` a long without a
    # default: it reads v2 data (int promotes to long) but not v1 data, which only a
    # backward *transitive* check notices.
    _write(directory, "demo", 1, _record("Demo", [_field("a", "string")]))
    fields_v2 = [_field("a", "string"), _field("b", "int", default=0)]
    _write(directory, "demo", 2, _record("Demo", fields_v2))
    _write(directory, "demo", 3, _record("Demo", [_field("a", "string"), _field("b", "long")]))


def test_schemas_check_fails_naming_type_versions_and_field(tmp_path: Path) -> None:
    _incompatible_set(tmp_path)
    result = CliRunner().invoke(schemas_group, ["check", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "demo v3 cannot read data written with v1: Demo.b: field added without a default" in (
        text
    )
    assert "v3 cannot read data written with v2" not in text
    (problem,) = check_directory(tmp_path).problems
    assert (problem.event_type, problem.reader_version, problem.writer_version) == ("demo", 3, 1)


def test_schemas_check_passes_when_a_migrator_covers_the_step(tmp_path: Path) -> None:
    _incompatible_set(tmp_path)
    migrators = MigratorRegistry()
    migrators.add("demo", 1, lambda body: {**body, "b": 0})
    report = check_directory(tmp_path, migrators)
    assert report.ok, [p.describe() for p in report.problems]
    assert set(report.migrated) == {("demo", 2, 1), ("demo", 3, 1)}
    assert report.resolved == (("demo", 3, 2),)


def test_schemas_check_flags_a_migrator_into_a_missing_version(tmp_path: Path) -> None:
    _write(tmp_path, "demo", 1, _record("Demo", [_field("a", "string")]))
    _write(tmp_path, "demo", 3, _record("Demo", [_field("a", "string")]))
    migrators = MigratorRegistry()
    migrators.add("demo", 1, dict)
    (problem,) = check_directory(tmp_path, migrators).problems
    assert "no demo.v2.avsc" in problem.describe()


def test_schemas_check_reports_an_empty_or_unloadable_folder(tmp_path: Path) -> None:
    empty = CliRunner().invoke(schemas_group, ["check", "--dir", str(tmp_path)])
    assert empty.exit_code == 1
    assert "no <event_type>.v<N>.avsc files" in empty.output
    (tmp_path / "not-a-schema.avsc").write_text("{}")
    result = CliRunner().invoke(schemas_group, ["check", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "cannot load the schemas" in result.output


def test_the_blackbox_cli_has_the_schemas_group() -> None:
    from agent_blackbox.cli.main import main

    result = CliRunner().invoke(main, ["schemas", "check"])
    assert result.exit_code == 0, result.output
