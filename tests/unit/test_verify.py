"""Tamper evidence: verify_run finds every change at its own sequence."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.replayer import read_archive
from agent_blackbox.replayer._verify import CheckpointStatus, Problem, VerifyReport, verify_run
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    Envelope,
    EnvelopeCodec,
    UndecodableMessage,
    digest,
    digest_bytes,
)
from agent_blackbox.schemas._checkpoint import Checkpoint, CheckpointSigner, CheckpointVerifier

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ticket-agent.v1.avro"
RUN = "run-1"
BLOB = b"\x10a large body stored out of line \x00\xff"
BLOB_REF = digest_bytes(BLOB)
TYPES = ("run.started", "llm.call", "tool.call", "clock.read", "tool.call", "run.finished")
BLOB_AT = 3  # the sequence whose body is out of line


class Blobs:
    """A blob reader over a dict, as the in-memory store is."""

    def __init__(self, stored: dict[str, bytes] | None = None) -> None:
        self.stored = {BLOB_REF: BLOB} if stored is None else stored

    def read(self, ref: str) -> bytes:
        return self.stored[ref]


def _chain(events: list[Envelope]) -> list[Envelope]:
    """``events`` with each chain hash recomputed: what a forger with write access does."""
    chained: list[Envelope] = []
    previous = GENESIS_CHAIN_HASH
    for event in events:
        event = replace(event, chain_hash=event.expected_chain_hash(previous))
        chained.append(event)
        previous = event.chain_hash
    return chained


def _run(*, run_id: str = RUN) -> list[Envelope]:
    start = datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC)
    events = []
    for sequence, event_type in enumerate(TYPES, start=1):
        out_of_line = sequence == BLOB_AT
        events.append(
            Envelope(
                event_id=f"6f1c1c55-8a4b-4d55-9b0e-{sequence:012x}",
                run_id=run_id,
                sequence=sequence,
                event_type=event_type,
                body_version=1,
                recorded_at=start + timedelta(milliseconds=sequence),
                tenant_id="acme",
                agent_id="ticket-agent",
                input_digest=digest({"step": sequence}),
                output_digest=digest({"result": sequence}),
                chain_hash="",
                subject_ids=("customer-1",),
                trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
                span_id=f"{sequence:016x}",
                payload=None if out_of_line else bytes([2, sequence]) + b"body",
                payload_ref=BLOB_REF if out_of_line else None,
                attributes={"tool": "lookup"},
            )
        )
    return _chain(events)


EVENTS = _run()


def _verify(events: list[Envelope], **options: Any) -> VerifyReport:
    options.setdefault("blobs", Blobs())
    return verify_run(iter(events), **options)


def _signer_and_verifier() -> tuple[CheckpointSigner, CheckpointVerifier]:
    signer = CheckpointSigner.generate(key_id="signer-1")
    return signer, CheckpointVerifier({signer.key_id: signer.public_key})


SIGNER, VERIFIER = _signer_and_verifier()


def _checkpoint(events: list[Envelope], **changes: Any) -> Checkpoint:
    last = events[-1]
    values: dict[str, Any] = {
        "run_id": last.run_id,
        "tenant_id": last.tenant_id,
        "last_sequence": last.sequence,
        "chain_head": last.chain_hash,
    } | changes
    return SIGNER.sign(**values)


def _found_at(report: VerifyReport, sequence: int, problem: Problem | None = None) -> None:
    assert not report.ok, report
    assert report.sequence == sequence, report
    if problem is not None:
        assert report.problem == problem, report
    if report.problem != Problem.CHECKPOINT_MISMATCH:  # the log itself is sound there
        assert report.last_sequence == sequence - 1, report


def test_a_clean_run_verifies() -> None:
    report = _verify(EVENTS)
    assert report.sound
    assert not report.ok  # no checkpoint vouches for it
    assert report.result == "unverified"
    assert report.unverified_from == 1
    assert report.problem is None
    assert report.events == len(EVENTS)
    assert report.run_id == RUN
    assert report.finished
    assert report.last_sequence == len(EVENTS)
    assert report.chain_head == EVENTS[-1].chain_hash
    assert report.checkpoint == "missing"
    assert report.unchecked_blobs == 0
    assert report.to_dict() == {
        "run_id": RUN,
        "ok": False,
        "result": "unverified",
        "unverified_from": 1,
        "events": 6,
        "problem": None,
        "sequence": None,
        "detail": "no checkpoint covers the run's events",
        "checkpoint": "missing",
        "finished": True,
        "last_sequence": 6,
        "chain_head": EVENTS[-1].chain_hash,
        "unchecked_blobs": 0,
        "skipped_messages": [],
    }


def test_the_golden_runs_verify() -> None:
    runs = [list(g) for _, g in groupby(read_archive(GOLDEN), key=lambda e: e.run_id)]
    assert runs
    for events in runs:
        report = verify_run(events)
        assert report.sound, report
        assert report.events == len(events)


def test_without_a_blob_reader_out_of_line_bodies_are_counted_as_unchecked() -> None:
    report = verify_run(EVENTS)
    assert report.sound
    assert report.unchecked_blobs == 1


def test_a_flipped_payload_byte_is_found_at_its_sequence() -> None:
    for index, event in enumerate(EVENTS):
        if event.payload is None:
            continue
        for position in range(len(event.payload)):
            for mask in (0x01, 0x80, 0xFF):
                payload = bytearray(event.payload)
                payload[position] ^= mask
                tampered = [*EVENTS]
                tampered[index] = replace(event, payload=bytes(payload))
                _found_at(_verify(tampered), event.sequence, Problem.BROKEN_CHAIN)


def _changes(event: Envelope) -> dict[str, Any]:
    """A changed value for every field of the envelope."""
    return {
        "event_id": "00000000-0000-0000-0000-000000000000",
        "run_id": "run-2",
        "sequence": event.sequence + 1,
        "event_type": "effect.intent",
        "body_version": event.body_version + 1,
        "recorded_at": event.recorded_at + timedelta(microseconds=1),
        "tenant_id": "globex",
        "agent_id": "other-agent",
        "input_digest": digest({"step": -1}),
        "output_digest": digest({"result": -1}),
        "chain_hash": "f" * 64,
        "subject_ids": ("customer-2",),
        "trace_id": None,
        "span_id": "0" * 16,
        "parent_span_id": "1" * 16,
        "payload": b"\x02other" if event.payload is not None else b"inline now",
        "payload_ref": digest_bytes(b"elsewhere") if event.payload_ref else BLOB_REF,
        "payload_encoding": "sealed-v1",
        "key_id": "key-9",
        "classification": "sensitive",
        "retention_class": "legal-hold",
        "attributes": {"tool": "lookup", "extra": "1"},
    }


def test_the_changes_cover_every_field() -> None:
    assert set(_changes(EVENTS[0])) == {f.name for f in fields(Envelope)}


@pytest.mark.parametrize("name", sorted(_changes(EVENTS[0])))
def test_a_changed_field_is_found_at_its_sequence(name: str) -> None:
    for index, event in enumerate(EVENTS):
        tampered = [*EVENTS]
        tampered[index] = replace(event, **{name: _changes(event)[name]})
        report = _verify(tampered, run_id=RUN)
        expected = {
            "run_id": Problem.WRONG_RUN,
            "sequence": Problem.SEQUENCE_GAP,
        }.get(name, Problem.BROKEN_CHAIN)
        _found_at(report, event.sequence, expected)
        # Without run_id the first event names the run; changing it still breaks the chain.
        _found_at(_verify(tampered), event.sequence)


def test_a_field_of_the_wrong_type_is_found_not_raised() -> None:
    for index, event in enumerate(EVENTS):
        wrong: tuple[tuple[str, Any], ...] = (
            ("recorded_at", "yesterday"),
            ("attributes", {"k": b"v"}),
        )
        for name, value in wrong:
            tampered = [*EVENTS]
            tampered[index] = replace(event, **{name: value})
            _found_at(_verify(tampered), event.sequence, Problem.BROKEN_CHAIN)


def test_a_flipped_byte_of_a_stored_envelope_is_found_at_its_sequence() -> None:
    codec = EnvelopeCodec()
    decoded_changes = 0
    for index, event in enumerate(EVENTS):
        stored = codec.encode(event)
        for position in range(len(stored)):
            flipped = bytearray(stored)
            flipped[position] ^= 0x01
            try:
                changed = codec.decode(bytes(flipped))
            except UndecodableMessage:
                continue  # found earlier, by the decoder
            if changed == event:
                continue  # a non-canonical encoding of the same values
            decoded_changes += 1
            tampered = [*EVENTS]
            tampered[index] = changed
            _found_at(_verify(tampered, run_id=RUN), event.sequence)
    assert decoded_changes > 100  # most flips decode to a different, plausible envelope


def test_a_deleted_event_is_a_gap_where_it_was() -> None:
    for index in range(len(EVENTS) - 1):
        tampered = EVENTS[:index] + EVENTS[index + 1 :]
        report = _verify(tampered)
        _found_at(report, index + 1, Problem.SEQUENCE_GAP)
        assert f"expected sequence {index + 1}" in report.detail


def test_a_deleted_last_event_is_only_seen_as_unfinished_or_by_a_checkpoint() -> None:
    report = _verify(EVENTS[:-1])
    assert report.sound
    assert not report.finished
    unfinished = _verify(EVENTS[:-1], require_finished=True)
    assert unfinished.problem == Problem.UNFINISHED
    assert unfinished.sequence is None
    signed = _verify(EVENTS[:-1], checkpoint=_checkpoint(EVENTS), verifier=VERIFIER)
    assert signed.problem == Problem.CHECKPOINT_MISMATCH
    assert signed.sequence == len(EVENTS)
    assert signed.checkpoint == "mismatch"


def test_reordered_events_are_a_gap_at_the_first_out_of_place() -> None:
    for index in range(len(EVENTS) - 1):
        tampered = [*EVENTS]
        tampered[index], tampered[index + 1] = tampered[index + 1], tampered[index]
        _found_at(_verify(tampered), index + 1, Problem.SEQUENCE_GAP)


def test_a_duplicated_event_is_a_gap_after_it() -> None:
    for index, event in enumerate(EVENTS):
        tampered = [*EVENTS[: index + 1], event, *EVENTS[index + 1 :]]
        report = _verify(tampered)
        _found_at(report, index + 2, Problem.SEQUENCE_GAP)
        assert f"read sequence {event.sequence}" in report.detail


def test_a_log_not_starting_at_one_is_a_gap_at_one() -> None:
    report = _verify(EVENTS[1:])
    _found_at(report, 1, Problem.SEQUENCE_GAP)
    assert "expected sequence 1 first" in report.detail


def test_a_rechained_deletion_is_a_gap_even_though_the_chain_holds() -> None:
    tampered = _chain([*EVENTS[:2], *EVENTS[3:]])
    _found_at(_verify(tampered), 3, Problem.SEQUENCE_GAP)


def test_an_event_of_another_run_is_wrong_run() -> None:
    other = _run(run_id="run-2")
    tampered = [*EVENTS[:2], other[2], *EVENTS[3:]]
    report = _verify(tampered)
    _found_at(report, 3, Problem.WRONG_RUN)
    assert "run-2" in report.detail
    assert verify_run(EVENTS, run_id="run-2").problem == Problem.WRONG_RUN


def test_no_events() -> None:
    report = verify_run([], run_id=RUN)
    assert report.problem == Problem.NO_EVENTS
    assert report.run_id == RUN
    assert report.events == 0
    assert report.chain_head is None


def test_a_changed_blob_is_a_payload_mismatch() -> None:
    flipped = bytearray(BLOB)
    flipped[5] ^= 0x01
    report = _verify(EVENTS, blobs=Blobs({BLOB_REF: bytes(flipped)}))
    _found_at(report, BLOB_AT, Problem.PAYLOAD_MISMATCH)
    assert digest_bytes(bytes(flipped)) in report.detail
    assert "large body" not in report.detail


def test_a_missing_blob_is_a_payload_mismatch_not_an_exception() -> None:
    report = _verify(EVENTS, blobs=Blobs({}))
    _found_at(report, BLOB_AT, Problem.PAYLOAD_MISMATCH)
    assert "cannot be read" in report.detail
    assert BLOB_REF in report.detail


def test_an_event_without_a_body_is_missing_payload() -> None:
    tampered = _chain([*EVENTS[:1], replace(EVENTS[1], payload=None), *EVENTS[2:]])
    _found_at(_verify(tampered), 2, Problem.MISSING_PAYLOAD)


def test_the_report_never_carries_payload_or_terminal_escapes() -> None:
    evil = "\x1b]0;pwned\x07[bold red]"
    tampered = [*EVENTS]
    tampered[1] = replace(EVENTS[1], chain_hash=evil)
    report = _verify(tampered)
    _found_at(report, 2, Problem.BROKEN_CHAIN)
    assert "\x1b" not in report.detail
    assert "\x07" not in report.detail
    assert "[bold" not in report.detail.replace("\\[bold", "")
    for event in EVENTS:
        if event.payload is not None:
            assert event.payload.decode("latin-1") not in report.detail


def test_a_valid_checkpoint() -> None:
    report = _verify(EVENTS, checkpoint=_checkpoint(EVENTS), verifier=VERIFIER)
    assert report.ok
    assert report.checkpoint is CheckpointStatus.VALID
    assert str(report.checkpoint) == "valid"
    assert report.to_dict()["checkpoint"] == "valid"


def test_a_checkpoint_signed_before_redaction_still_verifies() -> None:
    redacted = _chain([*EVENTS, replace(EVENTS[-1], sequence=7, event_type="run.redacted")])
    checkpoint = _checkpoint(redacted[:-1])
    report = _verify(redacted, checkpoint=checkpoint, verifier=VERIFIER)
    assert report.ok, report
    assert report.checkpoint == "valid"


def test_events_after_the_signed_head_are_a_mismatch() -> None:
    extended = _chain([*EVENTS, replace(EVENTS[-2], sequence=7)])
    report = _verify(extended, checkpoint=_checkpoint(EVENTS), verifier=VERIFIER)
    _found_at(report, 7, Problem.CHECKPOINT_MISMATCH)
    assert report.checkpoint == "mismatch"


def test_a_missing_checkpoint_when_required() -> None:
    assert _verify(EVENTS).sound
    report = _verify(EVENTS, require_checkpoint=True, verifier=VERIFIER)
    assert report.problem == Problem.CHECKPOINT_MISSING
    assert report.checkpoint == "missing"


def test_a_rewritten_log_does_not_match_its_checkpoint() -> None:
    checkpoint = _checkpoint(EVENTS)
    rewritten = _chain([*EVENTS[:2], replace(EVENTS[2], agent_id="forger"), *EVENTS[3:]])
    assert verify_run(rewritten, blobs=Blobs()).sound  # the chain alone cannot tell
    report = _verify(rewritten, checkpoint=checkpoint, verifier=VERIFIER)
    _found_at(report, len(EVENTS), Problem.CHECKPOINT_MISMATCH)
    assert report.checkpoint == "mismatch"
    assert checkpoint.chain_head in report.detail


@pytest.mark.parametrize(
    "change",
    [{"last_sequence": 5}, {"last_sequence": 9}, {"run_id": "run-2"}, {"tenant_id": "globex"}],
)
def test_a_genuine_checkpoint_of_something_else_is_a_mismatch(change: dict[str, Any]) -> None:
    report = _verify(EVENTS, checkpoint=_checkpoint(EVENTS, **change), verifier=VERIFIER)
    assert report.problem == Problem.CHECKPOINT_MISMATCH, report
    assert report.checkpoint == "mismatch"


def test_a_checkpoint_of_an_empty_log() -> None:
    report = verify_run([], checkpoint=_checkpoint(EVENTS), verifier=VERIFIER)
    assert report.problem == Problem.NO_EVENTS
    assert report.run_id == RUN
    assert report.checkpoint == "mismatch"


def test_a_forged_checkpoint() -> None:
    forger = CheckpointSigner.generate(key_id=SIGNER.key_id)
    forged = forger.sign(
        run_id=RUN, tenant_id="acme", last_sequence=6, chain_head=EVENTS[-1].chain_hash
    )
    report = _verify(EVENTS, checkpoint=forged, verifier=VERIFIER)
    assert report.problem == Problem.FORGED_CHECKPOINT
    assert report.checkpoint == "forged"
    assert "does not verify" in report.detail
    unknown = replace(_checkpoint(EVENTS), signer_key_id="nobody")
    report = _verify(EVENTS, checkpoint=unknown, verifier=VERIFIER)
    assert report.problem == Problem.FORGED_CHECKPOINT
    assert "no public key" in report.detail


def test_a_broken_log_with_a_forged_checkpoint_reports_the_log_first() -> None:
    forged = replace(_checkpoint(EVENTS), signature=b"\x00" * 64)
    report = _verify(EVENTS[:2] + EVENTS[3:], checkpoint=forged, verifier=VERIFIER)
    _found_at(report, 3, Problem.SEQUENCE_GAP)
    assert report.checkpoint == "forged"


def test_a_broken_log_before_the_signed_head_leaves_the_checkpoint_unchecked() -> None:
    report = _verify(EVENTS[:2] + EVENTS[3:], checkpoint=_checkpoint(EVENTS), verifier=VERIFIER)
    _found_at(report, 3, Problem.SEQUENCE_GAP)
    assert report.checkpoint == "not checked"


def test_a_checkpoint_needs_a_verifier() -> None:
    with pytest.raises(ValueError, match="verifier"):
        verify_run(EVENTS, checkpoint=_checkpoint(EVENTS))


def _long_run(count: int) -> Iterator[Envelope]:
    """A chained run generated on the fly, never held as a whole."""
    template = EVENTS[1]
    previous = GENESIS_CHAIN_HASH
    for sequence in range(1, count + 1):
        event = replace(template, sequence=sequence, chain_hash="")
        event = replace(event, chain_hash=event.expected_chain_hash(previous))
        previous = event.chain_hash
        yield event


def test_a_long_run_verifies_in_constant_memory() -> None:
    tracemalloc.start()
    try:
        report = verify_run(_long_run(5_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.sound
    assert report.events == 5_000
    assert peak < 200_000  # holding these 5,000 events would take about 1.8 MB
