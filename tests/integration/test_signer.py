"""The checkpoint signer's projection against a real Postgres: what it signs, when, and
what it flags, with runs recorded through the write side (no Kafka needed: the records
are the outbox's envelopes, delivered as the topic would)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from agent_blackbox.consumers import (
    BatchOutcome,
    CheckpointPolicy,
    Delivered,
    apply_batch,
    load_checkpoint,
    sign_batch,
    sweep_heads,
)
from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import CheckpointSigner, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._outbox import outbox_envelopes
from tests.security._signing import crashed_run, violations

pytestmark = pytest.mark.integration

SIGNER = CheckpointSigner.generate(key_id="signer-1")
POLICY = CheckpointPolicy(every_events=1000, every_seconds=60)
LATER = datetime.now(UTC) + timedelta(hours=1)


def _delivered(engine: Engine, run_id: str) -> list[Delivered]:
    envelopes = outbox_envelopes(engine, run_id)
    return [Delivered(e, "events", 0, 100 + e.sequence) for e in envelopes]


def _sign(engine: Engine, records: list[Delivered]) -> BatchOutcome:
    with engine.begin() as conn:
        return sign_batch(conn, records, signer=SIGNER, policy=POLICY)


def _sweep(engine: Engine, *, now: datetime = LATER) -> BatchOutcome:
    with engine.begin() as conn:
        return sweep_heads(conn, signer=SIGNER, policy=POLICY, now=now)


def test_repeats_are_told_from_conflicting_duplicates(settings: Settings, engine: Engine) -> None:
    [run] = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(1))
    records = _delivered(engine, run.run_id)
    with engine.begin() as conn:
        apply_batch(conn, records)  # the events index knows the first copies
    assert _sign(engine, records) == BatchOutcome(inserted=run.events)
    checkpoint = load_checkpoint(engine, run.run_id)
    assert checkpoint is not None
    assert (checkpoint.last_sequence, checkpoint.finished) == (run.events, True)

    redelivered = replace(records[2], offset=999)
    assert _sign(engine, [redelivered]) == BatchOutcome(duplicates=1)
    other_id = replace(
        records[1], envelope=replace(records[1].envelope, event_id=str(uuid.uuid4()))
    )
    assert _sign(engine, [other_id]) == BatchOutcome(violations=1)
    assert violations(engine, run.run_id) == [("conflicting_duplicate", 2)]
    # Within one batch too, and a redelivery of the flagged copy is not flagged twice.
    assert _sign(engine, [other_id]).violations == 1
    assert violations(engine, run.run_id) == [("conflicting_duplicate", 2)]


def test_a_running_run_waits_for_the_topic_then_is_signed_mid_run(
    settings: Settings, engine: Engine
) -> None:
    run_id, last = crashed_run(Recorder(engine, settings=settings), reads=3)
    records = _delivered(engine, run_id)
    assert len(records) == last == 4

    # The database knows more than the topic delivered so far: wait, even when swept.
    assert _sign(engine, records[:2]).inserted == 2
    assert _sweep(engine) == BatchOutcome()
    assert load_checkpoint(engine, run_id) is None
    # The rest arrives; the head is the database's, but not yet due (1000 events, 60 s).
    assert _sign(engine, records[2:]).inserted == 2
    assert load_checkpoint(engine, run_id) is None
    # Its wait (deferred by the first sweep) runs out: the sweep signs it, unfinished.
    assert _sweep(engine) == BatchOutcome()
    assert _sweep(engine, now=LATER + POLICY.wait) == BatchOutcome(inserted=1)
    checkpoint = load_checkpoint(engine, run_id)
    assert checkpoint is not None
    assert (checkpoint.last_sequence, checkpoint.finished) == (last, False)
    assert _sweep(engine, now=LATER + 2 * POLICY.wait) == BatchOutcome()  # signed once
    assert violations(engine, run_id) == []
