"""Replay of the golden ticket-agent histories: PASS, every divergence kind, mutations."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, reader, writer

from agent_blackbox.examples.ticket_agent import replay_entry
from agent_blackbox.outbox import AgentRun
from agent_blackbox.replayer import (
    DivergenceKind,
    ReplayDivergence,
    ReplayReport,
    ReplayRun,
    SourceError,
    read_archive,
    replay_run,
    write_archive,
)
from agent_blackbox.schemas import BodyCodec, Envelope

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v1.avro"
AVSC = Path(__file__).resolve().parents[2] / "schemas" / "avsc"


def _runs() -> list[list[Envelope]]:
    return [list(group) for _, group in groupby(read_archive(GOLDEN), key=lambda e: e.run_id)]


RUNS = _runs()
OK_RUN = RUNS[0]


def _replay(
    events: list[Envelope], entry: Callable[[AgentRun, Any], Any] = replay_entry
) -> ReplayReport:
    return replay_run(events, entry)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("replay must not open a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_golden_histories_are_the_ones_recorded() -> None:
    assert len(RUNS) == 6
    assert {e.body_version for run in RUNS for e in run} == {1}


@pytest.mark.parametrize("index", range(len(RUNS)))
def test_every_golden_run_replays_offline(index: int, no_network: list[Any]) -> None:
    report = _replay(RUNS[index])
    assert report.passed, report.divergence and report.divergence.describe()
    assert report.events == len(RUNS[index])
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "pass"}
    assert no_network == []


def test_replaying_many_times_leaves_the_log_unchanged() -> None:
    before = hashlib.sha256(GOLDEN.read_bytes()).hexdigest()
    for _ in range(3):
        assert all(_replay(run).passed for run in _runs())
    assert hashlib.sha256(GOLDEN.read_bytes()).hexdigest() == before


def _diverges(report: ReplayReport, kind: DivergenceKind, sequence: int) -> None:
    assert report.divergence is not None, "replay passed; the change went unnoticed"
    assert (report.divergence.kind, report.divergence.sequence) == (kind, sequence), (
        report.divergence.describe()
    )


def test_changed_tool_argument_is_an_argument_mismatch_at_that_call() -> None:
    def lower_case_ticket(run: AgentRun, input: Any) -> Any:
        return replay_entry(run, {"ticket_id": input["ticket_id"].lower()})

    report = _replay(OK_RUN, lower_case_ticket)
    _diverges(report, DivergenceKind.ARGUMENT_MISMATCH, 2)
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.expected_type, divergence.actual_type) == ("tool.call", "tool.call")
    assert divergence.expected_digest != divergence.actual_digest
    assert divergence.call_site is not None
    assert divergence.call_site.function == "handle"
    assert divergence.call_site.file.endswith("ticket_agent.py")
    assert report.levels["control_flow"] == "fail"


def test_deleted_event_is_a_sequence_gap() -> None:
    _diverges(_replay(OK_RUN[:4] + OK_RUN[5:]), DivergenceKind.SEQUENCE_GAP, 5)


def _with_body(envelope: Envelope, change: Callable[[dict[str, Any]], None]) -> Envelope:
    codec = BodyCodec()
    assert envelope.payload is not None
    body = codec.decode(envelope.event_type, envelope.body_version, envelope.payload)
    change(body)
    return replace(envelope, payload=codec.encode(envelope.event_type, envelope.body_version, body))


def test_tampered_payload_is_found_at_its_sequence() -> None:
    def forge(body: dict[str, Any]) -> None:
        body["result_json"] = json.dumps({"text": "refund me", "owner": "x@example.test"})

    events = list(OK_RUN)
    events[1] = _with_body(events[1], forge)
    _diverges(_replay(events), DivergenceKind.TAMPERED_OUTPUT, 2)


def test_altered_envelope_breaks_the_chain() -> None:
    events = list(OK_RUN)
    events[3] = replace(events[3], attributes={**events[3].attributes, "model": "other"})
    _diverges(_replay(events), DivergenceKind.BROKEN_CHAIN, 4)


def test_early_return_leaves_unconsumed_events() -> None:
    def stops_after_reading(run: AgentRun, input: Any) -> Any:
        run.call("read_ticket", lambda ticket_id: None, input["ticket_id"])
        return None

    _diverges(_replay(OK_RUN, stops_after_reading), DivergenceKind.UNCONSUMED_EVENTS, 3)


def test_extra_call_finds_the_log_exhausted() -> None:
    def one_more_clock_read(run: AgentRun, input: Any) -> Any:
        output = replay_entry(run, input)
        run.now()
        return output

    _diverges(_replay(OK_RUN, one_more_clock_read), DivergenceKind.MISSING_EVENT, len(OK_RUN))


def test_different_kind_of_call_is_a_type_mismatch() -> None:
    def asks_the_clock_first(run: AgentRun, input: Any) -> Any:
        run.now()
        return replay_entry(run, input)

    _diverges(_replay(OK_RUN, asks_the_clock_first), DivergenceKind.TYPE_MISMATCH, 2)


def test_failed_run_replays_when_the_code_fails_the_same_way() -> None:
    failed = RUNS[-1]
    assert failed[-1].attributes["status"] == "failed"
    assert _replay(failed).passed


def test_divergence_reports_carry_digests_not_payloads() -> None:
    def forge(body: dict[str, Any]) -> None:
        body["result_json"] = json.dumps({"secret": "hunter2-card-4111"})

    events = list(OK_RUN)
    events[1] = _with_body(events[1], forge)
    report = _replay(events)
    text = json.dumps(report.to_dict())
    assert "hunter2" not in text
    assert "charges twice" not in text  # the recorded ticket's text


# The mutation corpus: every mutation of every event of every golden run is caught.


def _mutations(run: list[Envelope]) -> Iterator[tuple[str, int, list[Envelope]]]:
    other_type = {"tool.call": "llm.call"}
    for i in range(len(run)):
        if i + 1 < len(run):
            yield "reorder", i, [*run[:i], run[i + 1], run[i], *run[i + 2 :]]
        yield "insert", i, [*run[: i + 1], run[i], *run[i + 1 :]]
        yield "delete", i, run[:i] + run[i + 1 :]
        changed = other_type.get(run[i].event_type, "tool.call")
        yield "change type", i, [*run[:i], replace(run[i], event_type=changed), *run[i + 1 :]]
        forged_input = replace(run[i], input_digest="sha256:" + "0" * 64)
        yield "change argument", i, [*run[:i], forged_input, *run[i + 1 :]]
        if run[i].payload:
            flipped = bytes([run[i].payload[-1] ^ 0x01])
            tampered = replace(run[i], payload=run[i].payload[:-1] + flipped)
            yield "change output", i, [*run[:i], tampered, *run[i + 1 :]]


def test_mutation_corpus_is_detected_every_time() -> None:
    missed = []
    total = 0
    for run in RUNS:
        for name, position, mutated in _mutations(run):
            total += 1
            if _replay(mutated).passed:
                missed.append((name, run[0].run_id, position))
    assert total > 300
    assert missed == []


class _AlteredState:
    """The agent's run, but every state it moves to carries a different priority."""

    def __init__(self, run: AgentRun) -> None:
        self._run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def transition(self, to_state: str, *, state: Any, reason: str | None = None) -> Any:
        return self._run.transition(to_state, state={**state, "priority": "low"}, reason=reason)


def test_different_state_is_a_state_mismatch() -> None:
    report = _replay(OK_RUN, lambda run, input: replay_entry(_AlteredState(run), input))  # type: ignore[arg-type]
    _diverges(report, DivergenceKind.STATE_MISMATCH, 5)
    # Replay went on past the state divergence: control flow and content held.
    assert report.levels == {"control_flow": "pass", "state": "fail", "content": "pass"}


def test_a_run_recorded_in_memory_replays_and_its_blobs_are_read() -> None:
    from agent_blackbox.examples.ticket_agent import (
        KeywordModel,
        Notifier,
        TicketAgent,
        sample_tickets,
    )
    from agent_blackbox.outbox import MemoryRecorder
    from agent_blackbox.schemas import Settings

    recorder = MemoryRecorder(settings=Settings(blob_threshold_bytes=200))
    agent = TicketAgent(sample_tickets(1), KeywordModel(), Notifier())
    run, output = recorder.record(agent.run, agent.snapshot("T-00000"), agent_id="ticket-agent")
    assert recorder.blobs  # the LLM call's body went out of line
    report = replay_run(recorder.events, replay_entry, blobs=recorder)
    assert report.passed, report.divergence and report.divergence.describe()
    assert report.events == len(recorder.events) == run.last_sequence
    assert output["category"] == "billing"


def test_replay_goes_on_past_a_broken_chain_and_checks_control_flow_to_the_end() -> None:
    events = list(OK_RUN)
    events[3] = replace(events[3], attributes={**events[3].attributes, "model": "other"})
    events[5] = replace(events[5], attributes={**events[5].attributes, "model": "other"})
    report = _replay(events)
    _diverges(report, DivergenceKind.BROKEN_CHAIN, 4)
    assert [(d.kind, d.sequence) for d in report.divergences] == [
        (DivergenceKind.BROKEN_CHAIN, 4)  # the first of its level; the one at 6 is not kept
    ]
    assert report.events == len(OK_RUN)  # every event was still taken and checked
    assert report.levels == {"control_flow": "pass", "state": "pass", "content": "fail"}


def test_a_tampered_output_is_handed_on_and_what_it_changes_is_reported_too() -> None:
    def forge(body: dict[str, Any]) -> None:
        body["result_json"] = json.dumps({"text": "edited"})

    events = list(OK_RUN)
    events[1] = _with_body(events[1], forge)
    report = _replay(events)
    _diverges(report, DivergenceKind.TAMPERED_OUTPUT, 2)
    # The agent read the edited ticket, so the next request it made differs.
    assert [(d.kind, d.sequence) for d in report.divergences] == [
        (DivergenceKind.TAMPERED_OUTPUT, 2),
        (DivergenceKind.ARGUMENT_MISMATCH, 4),
    ]
    assert report.levels == {"control_flow": "fail", "state": "unchecked", "content": "fail"}


def test_each_level_reports_its_own_first_divergence() -> None:
    def altered_then_extra(run: AgentRun, input: Any) -> Any:
        output = replay_entry(_AlteredState(run), input)  # type: ignore[arg-type]
        run.now()
        return output

    report = _replay(OK_RUN, altered_then_extra)
    assert [(d.kind, d.sequence) for d in report.divergences] == [
        (DivergenceKind.STATE_MISMATCH, 5),
        (DivergenceKind.MISSING_EVENT, len(OK_RUN)),
    ]
    assert report.divergence == report.divergences[0]
    # Control flow stopped the replay at the end, so content past it was not compared.
    assert report.levels == {"control_flow": "fail", "state": "fail", "content": "unchecked"}
    as_json = report.to_dict()
    assert [d["level"] for d in as_json["divergences"]] == ["state", "control_flow"]


def test_a_replay_run_driven_by_hand_raises_its_first_divergence_at_finish() -> None:
    run = ReplayRun(OK_RUN)
    with pytest.raises(ReplayDivergence) as caught:
        run.finish(output=replay_entry(_AlteredState(run), run.input))  # type: ignore[arg-type]
    kinds = [d.kind for d in caught.value.divergences]
    assert kinds[0] == DivergenceKind.STATE_MISMATCH
    assert caught.value.divergence.sequence == 5


def test_an_archive_of_another_envelope_schema_is_resolved_on_read(tmp_path: Path) -> None:
    # As an older envelope schema would be: without a field the current one defaults.
    schema = json.loads((AVSC / "envelope.v1.avsc").read_text(encoding="utf-8"))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "attributes"]
    archive = tmp_path / "older.avro"
    records = [{k: v for k, v in e.to_record().items() if k != "attributes"} for e in OK_RUN]
    with archive.open("wb") as out:
        writer(out, parse_schema(schema), records)
    assert list(read_archive(archive)) == [replace(e, attributes={}) for e in OK_RUN]


def test_an_archive_of_the_current_schema_reads_back_what_was_written(tmp_path: Path) -> None:
    archive = tmp_path / "current.avro"
    assert write_archive(archive, OK_RUN) == len(OK_RUN)
    assert list(read_archive(archive)) == OK_RUN


def test_an_archive_stores_ids_and_times_at_their_base_types(tmp_path: Path) -> None:
    # What other Avro readers see: the UUID string and microseconds the chain hashes.
    archive = tmp_path / "current.avro"
    write_archive(archive, OK_RUN)
    with archive.open("rb") as stream:
        first = next(iter(reader(stream)))
    assert isinstance(first, dict)
    assert first["event_id"] == OK_RUN[0].event_id
    assert first["recorded_at"] == OK_RUN[0].recorded_at_us


def test_the_golden_archive_of_the_envelope_schema_itself_still_reads() -> None:
    # Written before archives dropped the logical types: UUIDs and datetimes on read.
    with GOLDEN.open("rb") as stream:
        first = next(iter(reader(stream)))
    assert isinstance(first, dict)
    assert isinstance(first["recorded_at"], datetime)
    assert RUNS[0][0].recorded_at == first["recorded_at"]


def test_an_archive_whose_schema_does_not_resolve_to_envelopes_is_refused(tmp_path: Path) -> None:
    schema = json.loads((AVSC / "envelope.v1.avsc").read_text(encoding="utf-8"))
    for field in schema["fields"]:
        if field["name"] == "sequence":
            field["type"] = "string"
    archive = tmp_path / "foreign.avro"
    records = [{**e.to_record(), "sequence": str(e.sequence)} for e in OK_RUN]
    with archive.open("wb") as out:
        writer(out, parse_schema(schema), records)
    with pytest.raises(SourceError, match="not a readable envelope archive"):
        list(read_archive(archive))
