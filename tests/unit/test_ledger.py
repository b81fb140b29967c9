"""Which run.redacted notes a re-application after a restore may trust (no services)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from agent_blackbox.consumers import DatabaseFacts, LedgerEntry, entries_of, entry_problem
from agent_blackbox.consumers._redacted_views import SHREDDED_DIGEST
from agent_blackbox.consumers._views import StoredEvent
from agent_blackbox.outbox.lifecycle import RunHead
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BodyCodec,
    CheckpointSigner,
    CheckpointVerifier,
    Envelope,
    PayloadPipeline,
    deletion_statement,
)

SIGNER = CheckpointSigner.generate(key_id="retention-job")
VERIFIER = CheckpointVerifier({SIGNER.key_id: SIGNER.public_key})
RUN, TENANT, KEY = "run-a", "tenant-a", "dk-a"


def _envelope(sequence: int, event_type: str, payload: bytes, *, version: int = 1) -> Envelope:
    return Envelope(
        event_id=str(uuid.uuid4()),
        run_id=RUN,
        sequence=sequence,
        event_type=event_type,
        body_version=version,
        recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
        tenant_id=TENANT,
        agent_id="agent",
        input_digest="sha256:" + "0" * 64,
        output_digest="sha256:" + "0" * 64,
        chain_hash="",
        payload=payload,
    )


def _chained(envelopes: list[Envelope], previous: str = GENESIS_CHAIN_HASH) -> list[Envelope]:
    out = []
    for envelope in envelopes:
        envelope = replace(envelope, chain_hash=envelope.expected_chain_hash(previous))
        previous = envelope.chain_hash
        out.append(envelope)
    return out


def _note(sequence: int, key_ids: list[str], *, signer: CheckpointSigner | None) -> Envelope:
    statement = deletion_statement(
        run_id=RUN,
        tenant_id=TENANT,
        sequence=sequence,
        key_ids=key_ids,
        reason="forget",
        subject_id="alice",
        retention_class=None,
    )
    body = {
        "reason": "forget",
        "retention_class": None,
        "subject_id": "alice",
        "key_ids": key_ids,
        "signer_key_id": None if signer is None else signer.key_id,
        "signature": None if signer is None else signer.sign_statement(statement),
    }
    return _envelope(
        sequence, "run.redacted", BodyCodec().encode("run.redacted", 2, body), version=2
    )


def _run_then(note: Envelope) -> list[Envelope]:
    started = _envelope(1, "run.started", b"x")
    finished = _envelope(2, "run.finished", b"y")
    return _chained([started, finished, note])


def _entry(envelopes: list[Envelope]) -> LedgerEntry:
    [entry] = list(entries_of(envelopes, PayloadPipeline()))
    return entry


def _why(entry: LedgerEntry, facts: DatabaseFacts, verifier: CheckpointVerifier | None) -> str:
    """Why ``entry`` is refused; empty when it is applied."""
    return entry_problem(entry, facts, verifier) or ""


def _facts(
    *, ledger: frozenset[str] = frozenset(), owner: str = RUN, head: RunHead | None = None
) -> DatabaseFacts:
    return DatabaseFacts(ledger, {KEY: (owner, TENANT)}, head)


def test_a_note_signed_by_the_retention_job_and_chained_is_applied() -> None:
    entry = _entry(_run_then(_note(3, [KEY], signer=SIGNER)))
    assert entry.chained_in_topic
    assert entry_problem(entry, _facts(), VERIFIER) is None


def test_an_unsigned_note_the_database_ledger_does_not_record_is_refused() -> None:
    entry = _entry(_run_then(_note(3, [KEY], signer=None)))
    assert "deletion ledger" in _why(entry, _facts(), VERIFIER)
    assert entry_problem(entry, _facts(ledger=frozenset({KEY})), VERIFIER) is None


def test_a_note_signed_by_another_key_or_altered_after_signing_is_refused() -> None:
    forger = CheckpointSigner.generate(key_id=SIGNER.key_id)  # claims the job's key id
    forged = _entry(_run_then(_note(3, [KEY], signer=forger)))
    assert "does not verify" in _why(forged, _facts(), VERIFIER)

    genuine = _entry(_run_then(_note(3, [KEY], signer=SIGNER)))
    altered = replace(genuine, key_ids=(KEY, "dk-other"))
    assert "signature" in _why(altered, _facts(), VERIFIER)
    assert "no public key" in _why(genuine, _facts(), None)


def test_a_signed_note_naming_a_key_of_another_run_is_refused() -> None:
    entry = _entry(_run_then(_note(3, [KEY], signer=SIGNER)))
    assert "belongs to another run" in _why(entry, _facts(owner="run-b"), VERIFIER)


def test_a_note_naming_another_tenant_than_the_run_is_refused() -> None:
    entry = _entry(_run_then(_note(3, [KEY], signer=SIGNER)))
    head = RunHead("tenant-b", 2, entry.envelope.chain_hash if entry.envelope else "")
    assert "tenant" in _why(entry, _facts(head=head), VERIFIER)


def test_a_note_off_the_topic_chain_needs_the_database_chain_head() -> None:
    run = _run_then(_note(3, [KEY], signer=SIGNER))
    wrongly_chained = replace(run[2], chain_hash=run[2].expected_chain_hash(GENESIS_CHAIN_HASH))
    entry = _entry([*run[:2], wrongly_chained])
    assert not entry.chained_in_topic
    assert "chain does not verify" in _why(entry, _facts(), VERIFIER)

    # The topic lost the run's first events (retention): the database's head vouches.
    alone = _entry([run[2]])
    assert not alone.chained_in_topic
    head = RunHead(TENANT, 2, run[1].chain_hash)
    assert entry_problem(alone, _facts(head=head), VERIFIER) is None
    stale = RunHead(TENANT, 1, run[0].chain_hash)
    assert "chain" in _why(alone, _facts(head=stale), VERIFIER)


def test_a_repeated_or_forged_event_does_not_break_or_fake_the_topic_chain() -> None:
    run = _run_then(_note(3, [KEY], signer=SIGNER))
    repeated = [run[0], run[1], run[1], run[2]]  # at-least-once delivery
    assert _entry(repeated).chained_in_topic
    gap = [run[0], run[2]]
    assert not _entry(gap).chained_in_topic


def test_a_version_1_note_is_still_read_and_needs_the_database_ledger() -> None:
    body = {"reason": "retention", "retention_class": "standard", "subject_id": None}
    payload = BodyCodec().encode("run.redacted", 1, {**body, "key_ids": [KEY]})
    note = _envelope(3, "run.redacted", payload, version=1)
    entry = _entry(_run_then(note))
    assert (entry.key_ids, entry.reason, entry.signature) == ((KEY,), "retention", None)
    assert entry_problem(entry, _facts(), VERIFIER) is not None
    assert entry_problem(entry, _facts(ledger=frozenset({KEY})), VERIFIER) is None


def test_an_unreadable_note_is_reported_not_skipped() -> None:
    entry = _entry(_run_then(_envelope(3, "run.redacted", b"\xff\xff", version=2)))
    assert "cannot be read" in _why(entry, _facts(), VERIFIER)


def test_a_signed_statement_cannot_pass_for_a_checkpoint() -> None:
    with pytest.raises(ValueError, match="purpose"):
        SIGNER.sign_statement({"purpose": "agent-blackbox checkpoint v1", "run_id": RUN})


def test_a_redelivered_event_of_a_shredded_run_is_a_duplicate_not_a_violation() -> None:
    [event] = _chained([_envelope(1, "run.started", b"x")])
    shredded = StoredEvent(
        RUN, 1, event.event_id, SHREDDED_DIGEST, SHREDDED_DIGEST, event.chain_hash
    )
    assert shredded.matches(event)
    other = replace(event, input_digest="sha256:" + "1" * 64)
    forged = replace(other, chain_hash=other.expected_chain_hash(GENESIS_CHAIN_HASH))
    assert not shredded.matches(forged)  # another event at the same place still differs
