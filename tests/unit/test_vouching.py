"""How the consumers judge a run's events against the write side (no service: the
write side's answer and the stored predecessors are given)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from agent_blackbox.consumers._vouching import (
    EventKey,
    Unverified,
    _judge_run,
    _Stored,
)
from agent_blackbox.outbox.lifecycle import RunHead
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, Envelope, EventType

RUN = "run-1"
NOTHING_STORED = _Stored({}, {})


def _chained(kinds: Sequence[str], *, previous: str = GENESIS_CHAIN_HASH) -> list[Envelope]:
    """Events of :data:`RUN` of ``kinds``, sequence 1 on, correctly chained."""
    events = []
    for sequence, kind in enumerate(kinds, start=1):
        event = Envelope(
            event_id=str(uuid.uuid4()),
            run_id=RUN,
            sequence=sequence,
            event_type=kind,
            body_version=1,
            recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
            tenant_id="default",
            agent_id="agent",
            input_digest="i",
            output_digest="o",
            chain_hash="",
            payload=b"body",
            payload_encoding="avro",
        )
        event = replace(event, chain_hash=event.expected_chain_hash(previous))
        previous = event.chain_hash
        events.append(event)
    return events


def _judged(
    events: Sequence[Envelope],
    head: RunHead | None,
    *,
    asked: bool = True,
    stored: _Stored = NOTHING_STORED,
) -> dict[int, str]:
    found: dict[EventKey, Unverified] = {}
    _judge_run(events, asked, head, stored, found)
    return {sequence: why.reason for (_, sequence), why in found.items()}


def _head(events: Sequence[Envelope], *, tenant: str = "default") -> RunHead:
    return RunHead(tenant, events[-1].sequence, events[-1].chain_hash)


KINDS = (EventType.RUN_STARTED, EventType.LLM_CALL, EventType.RUN_FINISHED)


def test_a_recorded_run_is_vouched_for() -> None:
    events = _chained(KINDS)
    assert _judged(events, _head(events)) == {}


def test_a_run_the_write_side_does_not_hold_is_unverified_whole() -> None:
    events = _chained(KINDS)
    found: dict[EventKey, Unverified] = {}
    _judge_run(events, True, None, NOTHING_STORED, found)
    assert set(found) == {(RUN, 1), (RUN, 2), (RUN, 3)}
    assert all(why.unknown_run for why in found.values())


def test_without_the_write_side_only_the_log_s_own_checks_apply() -> None:
    events = _chained((*KINDS, EventType.TOOL_CALL))
    assert _judged(events, None, asked=False) == {
        4: "it follows the run's run.finished (sequence 3)"
    }


def test_past_the_head_another_tenant_and_another_head_are_unverified() -> None:
    events = _chained(KINDS)
    head = _head(events[:2])
    assert _judged(events, head) == {3: "sequence 3 is past the write side's head (2)"}
    assert _judged(events, _head(events, tenant="other")) == {
        s: "the write side holds this run under another tenant" for s in (1, 2, 3)
    }
    other = RunHead("default", 3, "ff" * 32)
    assert _judged(events, other) == {3: "its chain hash is not the write side's chain head"}


def test_a_chain_break_is_judged_against_the_batch_or_the_stored_predecessor() -> None:
    events = _chained(KINDS)
    broken = replace(events[1], chain_hash="ab" * 32)
    head = RunHead("default", 3, events[2].chain_hash)
    assert _judged([events[0], broken, events[2]], head) == {
        2: "its chain hash does not follow from sequence 1's"
    }
    stored = _Stored({(RUN, 1): events[0].chain_hash}, {})
    assert _judged([broken, events[2]], head, stored=stored) == {
        2: "its chain hash does not follow from sequence 1's"
    }
    # Neither in the batch nor stored (a rebuild whose first events are gone): unjudged.
    assert _judged([broken], head) == {}


def test_an_unverified_predecessor_vouches_for_no_successor() -> None:
    """The genuine event after a forged one is not called off the chain for it."""
    events = _chained(KINDS)
    forged = replace(events[1], chain_hash="ab" * 32)
    genuine_next = events[2]
    assert _judged([events[0], forged, genuine_next], _head(events)) == {
        2: "its chain hash does not follow from sequence 1's"
    }


def test_after_the_end_only_a_redaction_note_may_come() -> None:
    events = _chained((*KINDS, EventType.RUN_REDACTED, EventType.TOOL_CALL))
    head = _head(events)  # as if the write side had committed them all
    assert _judged(events, head) == {5: "it follows the run's run.finished (sequence 3)"}
    stored = _Stored({(RUN, 3): events[2].chain_hash}, {RUN: 3})
    assert _judged(events[3:], head, stored=stored) == {
        5: "it follows the run's run.finished (sequence 3)"
    }


def test_a_predecessor_s_chain_hash_that_is_no_digest_breaks_the_chain() -> None:
    events = _chained(KINDS)
    stored = _Stored({(RUN, 1): "chain-1"}, {})  # what a producer may have written
    assert _judged(events[1:], _head(events), stored=stored) == {
        2: "its chain hash does not follow from sequence 1's"
    }
