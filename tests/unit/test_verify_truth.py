"""verify_run says what it knows: mid-run checkpoints cover a prefix, a log shorter than
the database or the index is truncated, a log the database never committed is found,
and plaintext after sealed bodies is refused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent_blackbox.replayer._verify import (
    DatabaseCheck,
    Problem,
    RecordedHead,
    VerifyReport,
    verify_run,
)
from agent_blackbox.schemas import PLAIN_ENCODING, Envelope, EventType
from tests.unit.test_verify import EVENTS, SIGNER, VERIFIER, Blobs, _chain

LAST = EVENTS[-1]


def _verify(events: list[Envelope], **options: Any) -> VerifyReport:
    options.setdefault("blobs", Blobs())
    if "checkpoint" in options:
        options.setdefault("verifier", VERIFIER)
    return verify_run(iter(events), **options)


def _signed(upto: int, *, finished: bool | None) -> Any:
    head = EVENTS[upto - 1]
    return SIGNER.sign(
        run_id=head.run_id,
        tenant_id=head.tenant_id,
        last_sequence=upto,
        chain_head=head.chain_hash,
        finished=finished,
    )


def _db(
    last: int, chain: str | None = None, *, ended: bool = True, pending: int = 0
) -> DatabaseCheck:
    head = RecordedHead(last, chain or EVENTS[last - 1].chain_hash, ended=ended)
    return DatabaseCheck(head, head, pending_before=pending)


def test_a_final_checkpoint_makes_a_run_ok() -> None:
    report = _verify(EVENTS, checkpoint=_signed(len(EVENTS), finished=True))
    assert (report.ok, report.result, report.unverified_from) == (True, "ok", None)


def test_a_mid_run_checkpoint_verifies_its_prefix_and_leaves_the_rest_unverified() -> None:
    report = _verify(EVENTS, checkpoint=_signed(3, finished=False))
    assert report.sound
    assert not report.ok
    assert report.result == "unverified"
    assert report.unverified_from == 4
    assert report.checkpoint == "valid"
    assert "covers events 1 to 3" in report.detail
    # A final checkpoint at the same head does not allow more events after it.
    final = _verify(EVENTS, checkpoint=_signed(3, finished=True))
    assert final.problem == Problem.CHECKPOINT_MISMATCH


def test_a_mid_run_checkpoint_of_a_crashed_run_covers_it_all() -> None:
    crashed = EVENTS[:4]
    report = _verify(crashed, checkpoint=_signed(4, finished=False))
    assert report.ok
    assert not report.finished


def test_a_log_shorter_than_the_database_says_is_truncated() -> None:
    report = _verify(EVENTS[:4], database=_db(len(EVENTS)))
    assert (report.problem, report.sequence) == (Problem.TRUNCATED, 5)
    assert "blackbox.runs committed 6 events" in report.detail


def test_events_still_in_the_outbox_are_unverified_not_truncated() -> None:
    report = _verify(EVENTS[:4], database=_db(len(EVENTS), pending=2))
    assert report.sound
    assert report.result == "unverified"
    assert report.unverified_from == 1
    assert "not published yet" in report.detail


def test_without_the_outbox_an_ended_run_short_of_the_database_is_truncated() -> None:
    ended = _db(len(EVENTS), pending=0)
    unknown = replace(ended, pending_before=None)
    assert _verify(EVENTS[:4], database=unknown).problem == Problem.TRUNCATED
    head = RecordedHead(len(EVENTS), LAST.chain_hash, ended=False)
    running = DatabaseCheck(head, head, pending_before=None)
    report = _verify(EVENTS[:4], database=running)
    assert report.sound
    assert report.result == "unverified"


def test_a_log_shorter_than_the_index_says_is_truncated() -> None:
    report = _verify(EVENTS[:5], indexed_events=6)
    assert (report.problem, report.sequence) == (Problem.TRUNCATED, 6)
    assert _verify(EVENTS, indexed_events=6).sound


def test_events_the_database_never_committed_are_found() -> None:
    report = _verify(EVENTS, database=_db(4))
    assert (report.problem, report.sequence) == (Problem.AHEAD_OF_DATABASE, 5)


def test_another_head_at_the_database_sequence_is_found() -> None:
    report = _verify(EVENTS, database=_db(len(EVENTS), chain="0" * 64))
    assert (report.problem, report.sequence) == (Problem.HEAD_MISMATCH, len(EVENTS))


def test_a_run_the_database_does_not_know() -> None:
    unknown = DatabaseCheck(None, None)
    report = _verify(EVENTS, database=unknown)
    assert report.problem == Problem.NOT_IN_DATABASE
    # Signed at its end while the database knew it: retention deleted the row since.
    vouched = _verify(EVENTS, database=unknown, checkpoint=_signed(len(EVENTS), finished=True))
    assert vouched.ok
    # A mid-run checkpoint does not vouch for a run that is gone.
    mid = _verify(EVENTS, database=unknown, checkpoint=_signed(len(EVENTS), finished=False))
    assert mid.problem == Problem.NOT_IN_DATABASE


def test_the_database_is_read_after_the_log() -> None:
    read: list[int] = []

    def lookup() -> DatabaseCheck:
        read.append(len(read))
        return _db(len(EVENTS))

    def events() -> Any:
        for event in EVENTS:
            assert not read, "the database was read before the log"
            yield event

    report = verify_run(events(), blobs=Blobs(), database=lookup)
    assert read == [0]
    assert report.sound


def _sealed(events: list[Envelope]) -> list[Envelope]:
    return [replace(e, key_id="key-1", payload_encoding="avro+aes256gcm+aad2") for e in events]


@pytest.mark.parametrize("at", [2, 4, 6])
def test_plaintext_after_a_sealed_body_is_refused(at: int) -> None:
    events = _sealed(EVENTS)
    events[at - 1] = replace(events[at - 1], key_id=None, payload_encoding=PLAIN_ENCODING)
    report = _verify(_chain(events))
    assert (report.problem, report.sequence) == (Problem.PLAINTEXT_IN_SEALED_RUN, at)
    assert "plaintext" in report.detail


def test_a_plain_redaction_note_may_follow_sealed_bodies() -> None:
    note = replace(
        EVENTS[1],
        sequence=len(EVENTS) + 1,
        event_type=EventType.RUN_REDACTED,
        key_id=None,
        payload_encoding=PLAIN_ENCODING,
    )
    report = _verify(_chain([*_sealed(EVENTS), note]))
    assert report.sound, report
    plain_run = _verify(EVENTS)  # never sealed: plaintext throughout is fine
    assert plain_run.sound
