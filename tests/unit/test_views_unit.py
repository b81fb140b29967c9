"""The Python side of the views projection: dedupe, collision sorting, run aggregation."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_blackbox.consumers import (
    BatchOutcome,
    ConsumerMetrics,
    Delivered,
    ProjectionFailed,
    views_screen,
)
from agent_blackbox.consumers._dead_letters import (
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_TOPIC,
    Poison,
)
from agent_blackbox.consumers._views import (
    CONFLICTING_DUPLICATE,
    DIGEST_MISMATCH,
    EVENT_ID_REUSED,
    StoredEvent,
    aggregate_runs,
    classify_collisions,
    split_repeats,
)
from agent_blackbox.schemas import Envelope, EventType

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def envelope(run_id: str, sequence: int, event_type: str = "tool.call", **kw: Any) -> Envelope:
    marker = kw.pop("marker", "a")
    values: dict[str, Any] = {
        "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{sequence}/{marker}")),
        "run_id": run_id,
        "sequence": sequence,
        "event_type": event_type,
        "body_version": 1,
        "recorded_at": T0 + timedelta(seconds=sequence % 100_000),
        "tenant_id": "t",
        "agent_id": "a",
        "input_digest": f"in-{marker}",
        "output_digest": f"out-{marker}",
        "chain_hash": f"chain-{sequence}-{marker}",
        **kw,
    }
    return Envelope(**values)


def delivered(env: Envelope, offset: int = 0) -> Delivered:
    return Delivered(env, "topic", 0, offset)


def stored(env: Envelope) -> StoredEvent:
    return StoredEvent(
        env.run_id,
        env.sequence,
        env.event_id,
        env.input_digest,
        env.output_digest,
        env.chain_hash,
    )


def test_split_repeats_keeps_the_first_of_each_run_and_sequence() -> None:
    one, two = envelope("r", 1), envelope("r", 2)
    records = [delivered(one, 0), delivered(two, 1), delivered(one, 2), delivered(two, 3)]

    firsts, repeats = split_repeats(records)

    assert [r.offset for r in firsts] == [0, 1]
    assert [r.offset for r in repeats] == [2, 3]


def test_split_repeats_tells_runs_apart() -> None:
    firsts, repeats = split_repeats([delivered(envelope("r1", 1)), delivered(envelope("r2", 1))])
    assert (len(firsts), repeats) == (2, [])


def test_same_digests_are_a_duplicate() -> None:
    env = envelope("r", 1)
    duplicates, violations = classify_collisions([delivered(env)], [stored(env)])
    assert (len(duplicates), violations) == (1, [])


@pytest.mark.parametrize("field", ["input_digest", "output_digest", "chain_hash"])
def test_any_differing_digest_is_a_violation(field: str) -> None:
    original = envelope("r", 1)
    forged = envelope("r", 1, **{field: "forged"})

    duplicates, violations = classify_collisions([delivered(forged)], [stored(original)])

    assert duplicates == []
    (violation,) = violations
    assert violation.kind == DIGEST_MISMATCH
    assert violation.existing == stored(original)
    assert violation.incoming.envelope is forged


def test_a_copy_under_another_event_id_is_a_conflicting_duplicate() -> None:
    """A forged run.redacted with the digests and chain hash of the event at its place,
    say: not a relay's repeat, which is the same envelope."""
    original = envelope("r", 1)
    forged = envelope("r", 1, event_id="forged", event_type="run.redacted")
    duplicates, (violation,) = classify_collisions([delivered(forged)], [stored(original)])
    assert duplicates == []
    assert violation.kind == CONFLICTING_DUPLICATE


def test_an_event_id_reused_by_another_event_is_a_violation() -> None:
    original = envelope("r", 1)
    reuse = envelope("r", 2, event_id=original.event_id)

    _, (violation,) = classify_collisions([delivered(reuse)], [stored(original)])

    assert violation.kind == EVENT_ID_REUSED


def test_a_collision_without_a_stored_row_fails_loudly() -> None:
    with pytest.raises(ProjectionFailed, match="retried"):
        classify_collisions([delivered(envelope("r", 1))], [])


def test_aggregate_counts_and_takes_the_highest_sequence() -> None:
    envelopes = [envelope("r", 3), envelope("r", 1), envelope("r", 2)]

    (delta,) = aggregate_runs(envelopes)

    assert (delta.event_count, delta.last_sequence) == (3, 3)
    assert delta.last_event_at == T0 + timedelta(seconds=3)
    assert (delta.started_at, delta.finished_at, delta.status) == (None, None, None)


def test_aggregate_takes_start_and_finish_facts_from_attributes() -> None:
    started = envelope(
        "r",
        1,
        EventType.RUN_STARTED,
        attributes={"code_version": "v7", "parent_run_id": "p"},
        payload=b"sealed: never decoded",
    )
    finished = envelope("r", 4, EventType.RUN_FINISHED, attributes={"status": "failed"})

    (delta,) = aggregate_runs([started, envelope("r", 2), finished])

    assert (delta.code_version, delta.parent_run_id) == ("v7", "p")
    assert delta.started_at == started.recorded_at
    assert (delta.finished_at, delta.status) == (finished.recorded_at, "failed")


def test_a_finish_without_status_still_finishes_the_run() -> None:
    (delta,) = aggregate_runs([envelope("r", 9, EventType.RUN_FINISHED)])
    assert delta.status == "finished"


def test_aggregate_yields_one_delta_per_run_in_run_id_order() -> None:
    deltas = aggregate_runs([envelope("b", 1), envelope("a", 1), envelope("b", 2)])
    assert [(d.run_id, d.event_count) for d in deltas] == [("a", 1), ("b", 2)]


def test_screen_accepts_an_ordinary_envelope() -> None:
    assert views_screen(envelope("r", 1)) is None


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"sequence": 0}, "sequence 0"),
        ({"sequence": 2**63}, "outside"),
        ({"run_id": "r\x00"}, "run_id contains a NUL"),
        ({"attributes": {"status": "ok\x00"}}, "attributes.status"),
        ({"attributes": {"tool": "t\x00x"}}, "attribute 'tool'"),
        ({"attributes": {"k\x00": "v"}}, "attribute 'k\\x00'"),
        ({"subject_ids": ("s\x00",)}, "subject id"),
    ],
)
def test_screen_rejects_what_postgres_would_refuse(overrides: dict[str, Any], reason: str) -> None:
    values = {"run_id": "r", "sequence": 1, **overrides}
    found = views_screen(envelope(values.pop("run_id"), values.pop("sequence"), **values))
    assert found is not None
    assert reason in found


_TEXT_FIELDS = (
    "event_id",
    "run_id",
    "event_type",
    "tenant_id",
    "agent_id",
    "input_digest",
    "output_digest",
    "chain_hash",
    "key_id",
    "payload_ref",
)


@pytest.mark.parametrize("name", [*_TEXT_FIELDS, "code_version", "parent_run_id", "status"])
def test_screen_finds_a_nul_in_every_text_field(name: str) -> None:
    base = envelope("r", 2, key_id="k", payload_ref="p")
    attributes = {"code_version": "v", "parent_run_id": "q", "status": "ok"}
    if name in _TEXT_FIELDS:
        changes: dict[str, Any] = {name: f"x\x00{name}", "attributes": attributes}
        found = views_screen(replace(base, **changes))
    else:
        found = views_screen(replace(base, attributes={**attributes, name: "x\x00"}))
    assert found is not None
    assert name in found
    assert views_screen(replace(base, attributes=attributes)) is None


def test_outcomes_add_up() -> None:
    total = BatchOutcome(inserted=2, duplicates=1) + BatchOutcome(violations=1, dead_lettered=3)
    assert total == BatchOutcome(inserted=2, duplicates=1, violations=1, dead_lettered=3)
    assert total.messages == 7


def test_dead_letter_headers_keep_the_originals_and_name_the_source() -> None:
    poison = Poison("events", 2, 41, b"run-1", b"garbage", (("trace", b"t1"),), "not Avro")

    headers = poison.dlq_headers()

    assert headers[0] == ("trace", b"t1")
    assert dict(headers[1:]) == {
        DLQ_REASON: b"not Avro",
        DLQ_TOPIC: b"events",
        DLQ_PARTITION: b"2",
        DLQ_OFFSET: b"41",
    }


def test_many_consumers_share_one_registry() -> None:
    registry = CollectorRegistry()
    first = ConsumerMetrics(consumer="views", group="g1", topic="t", registry=registry)
    second = ConsumerMetrics(consumer="views", group="g2", topic="t", registry=registry)

    first.batch_committed(BatchOutcome(inserted=5), 0.01)
    second.batch_committed(BatchOutcome(inserted=2, dead_lettered=1), 0.01)

    def sample(name: str, group: str) -> float | None:
        labels = {"consumer": "views", "group": group, "topic": "t"}
        return registry.get_sample_value(f"blackbox_consumer_{name}_total", labels)

    assert sample("events_inserted", "g1") == 5
    assert sample("messages", "g2") == 3
