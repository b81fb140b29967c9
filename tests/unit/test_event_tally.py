"""Counting distinct events of restored messages, and drawing the drill's replay sample."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from agent_blackbox.backup import EventTally
from agent_blackbox.backup._drill_sample import EntryPoints, plan_sample, replay_arguments
from agent_blackbox.schemas import Envelope, EnvelopeCodec

CODEC = EnvelopeCodec()


def _envelope(run_id: str, sequence: int, agent_id: str = "agent") -> Envelope:
    return Envelope(
        event_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{sequence}")),
        run_id=run_id,
        sequence=sequence,
        event_type="tool.call",
        body_version=1,
        recorded_at=datetime(2026, 3, 1, tzinfo=UTC),
        tenant_id="acme",
        agent_id=agent_id,
        input_digest="sha256:" + "0" * 64,
        output_digest="sha256:" + "0" * 64,
        chain_hash="",
    )


def _tally(*envelopes: Envelope) -> EventTally:
    tally = EventTally()
    for envelope in envelopes:
        tally.add(CODEC.encode(envelope))
    return tally


def test_re_delivered_copies_are_counted_once_and_as_a_figure() -> None:
    a = [_envelope("run-a", s) for s in (1, 2, 3)]
    tally = _tally(*a, a[1], a[2], _envelope("run-b", 1), a[2])

    assert (tally.messages, tally.events, tally.duplicates) == (7, 4, 3)
    assert (tally.distinct("run-a"), tally.copies("run-a")) == (3, 6)
    assert tally.conflicts == []
    assert tally.runs == ["run-a", "run-b"]


def test_a_copy_with_another_event_id_is_a_conflict_naming_both_ids() -> None:
    first = _envelope("run-a", 2)
    other = dataclasses.replace(first, event_id=str(uuid.uuid4()))
    tally = _tally(_envelope("run-a", 1), first, other)

    assert (tally.events, tally.duplicates, tally.conflicting) == (2, 0, 1)
    [said] = tally.conflicts
    assert "run run-a sequence 2: a copy with other event id" in said
    assert first.event_id in said
    assert other.event_id in said


def test_a_copy_with_other_bytes_is_a_conflict() -> None:
    first = _envelope("run-a", 1)
    tally = _tally(first, dataclasses.replace(first, input_digest="sha256:" + "1" * 64))

    assert tally.conflicting == 1
    assert "with other bytes than the first" in tally.conflicts[0]


def test_a_gap_counts_the_events_there_are_and_undecodable_values_apart() -> None:
    tally = _tally(_envelope("run-a", 1), _envelope("run-a", 4))
    tally.add(b"not an envelope")

    assert (tally.distinct("run-a"), tally.undecodable, tally.messages) == (2, 1, 3)


def test_the_sample_is_shared_among_agents_with_an_entry_point_and_others_skipped() -> None:
    runs = {f"r{i}": "alpha" for i in range(5)} | {"b1": "beta", "c1": "gamma", "c2": "gamma"}
    entries = EntryPoints.of(["beta=pkg.beta:entry"], {"BLACKBOX_AGENTS": "alpha=pkg.a:run"})

    plan = plan_sample(runs, entries, 4)

    assert plan.quotas == {"alpha": 3, "beta": 1}
    assert plan.skipped_runs == 2
    assert plan.describe_skipped() == "2 runs of 1 agent without an entry point skipped (gamma)"
    [(_, alpha), (_, beta)] = replay_arguments(plan, entries, "drill")
    assert alpha[alpha.index("--agent-id") + 1] == "alpha"
    assert alpha[-2:] == ["--agent", "beta=pkg.beta:entry"]
    assert beta[beta.index("--limit") + 1] == "1"


def test_a_default_entry_point_serves_every_agent_in_one_replay() -> None:
    entries = EntryPoints.of(["pkg.agent:entry"], {})

    plan = plan_sample({"r1": "alpha", "r2": "beta"}, entries, 20)

    assert plan.quotas == {None: 20}
    assert plan.skipped_runs == 0
    assert not EntryPoints.of([], {}).serve("alpha")
    assert EntryPoints.of([], {}).empty
