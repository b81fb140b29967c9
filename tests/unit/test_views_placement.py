"""The views' placement check: an event is where the relay puts its run, or flagged."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from agent_blackbox.broker import run_partition
from agent_blackbox.consumers._batch import Delivered
from agent_blackbox.consumers._views import WRONG_PARTITION, wrong_partition
from agent_blackbox.schemas import Envelope

PARTITIONS = 12


def _delivered(run_id: str, partition: int, topic: str = "events") -> Delivered:
    envelope = Envelope(
        event_id=str(uuid.uuid4()),
        run_id=run_id,
        sequence=1,
        event_type="run.started",
        body_version=1,
        recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
        tenant_id="t",
        agent_id="a",
        input_digest="i",
        output_digest="o",
        chain_hash="c",
        payload=b"",
    )
    return Delivered(envelope, topic, partition, 0)


def test_only_events_off_their_runs_partition_are_flagged() -> None:
    home = run_partition("run-1", PARTITIONS)
    placed = _delivered("run-1", home)
    misplaced = _delivered("run-1", (home + 1) % PARTITIONS)

    [violation] = wrong_partition([placed, misplaced], {"events": PARTITIONS})

    assert violation.kind == WRONG_PARTITION
    assert violation.incoming is misplaced
    assert f"partition {home} of {PARTITIONS}" in violation.detail


def test_a_topic_of_unknown_partition_count_is_not_judged() -> None:
    home = run_partition("run-1", PARTITIONS)
    assert wrong_partition([_delivered("run-1", home + 1, topic="other")], {}) == []
