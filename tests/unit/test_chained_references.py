"""The bodies a run's genuine events name are read along its chain: a forged copy of an
event beside the real one, even one whose own chain hash is consistent, is not on the
path from the genesis hash to the head the write side recorded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
from agent_blackbox.replayer import chained_references
from agent_blackbox.replayer._chain_refs import MAX_COPIES, TooManyCopies
from agent_blackbox.schemas import Envelope, Settings

BIG = "x" * 200_000  # out of line, uncompressed


def _agent(run: Any, input: Any) -> Any:
    run.call("fetch", lambda n: BIG[:n], 150_000)
    run.call("small", lambda n: n, 1)
    return "done"


def _run() -> list[Envelope]:
    recorder = MemoryRecorder(settings=Settings(payload_compression="none"))
    recorder.record(_agent, RunSnapshot("v1", {}), agent_id="a")
    return list(recorder.events)


def _forged(genuine: Envelope, previous: str, ref: str) -> Envelope:
    """A copy naming another body, with a chain hash consistent with its predecessor."""
    return replace(genuine, payload=None, payload_ref=ref, chain_hash="").linked(previous)


def test_the_genuine_references_are_read_up_to_the_head() -> None:
    events = _run()
    head = events[-1]
    refs = chained_references(events, head.sequence, head.chain_hash)
    assert refs == [(2, events[1].payload_ref)]
    assert events[1].payload_ref is not None


def test_a_forged_copy_is_not_on_the_path_to_the_recorded_head() -> None:
    events = _run()
    planted = "sha256:" + "ab" * 32
    forged = _forged(events[2], events[1].chain_hash, planted)  # consistent with seq 2
    head = events[-1]
    for order in ([forged, *events], [*events, forged]):
        refs = chained_references(order, head.sequence, head.chain_hash)
        assert refs == [(2, events[1].payload_ref)], "the forged copy is not followed"
    # A head at the forged copy's sequence: only the real copy's hash is the head.
    assert chained_references([forged, *events], 3, events[2].chain_hash) == [
        (2, events[1].payload_ref)
    ]
    assert chained_references([forged, *events], 3, forged.chain_hash) == [
        (2, events[1].payload_ref),
        (3, planted),
    ], "were the forged hash the head, its path would be the one read"


def test_no_chain_to_the_head_is_none() -> None:
    events = _run()
    head = events[-1]
    assert chained_references(events[:1] + events[2:], head.sequence, head.chain_hash) is None
    assert chained_references(events, head.sequence, "00" * 32) is None
    tampered = replace(events[1], payload_ref="sha256:" + "cd" * 32)  # its hash kept
    assert (
        chained_references([events[0], tampered, *events[2:]], head.sequence, head.chain_hash)
        is None
    )


def test_more_copies_of_an_event_than_a_relay_leaves_are_refused_not_followed() -> None:
    """Thousands of forged copies, each chained to one before it, would cost a hash for
    every pair: the run is refused at once, naming why."""
    events = _run()
    copies = [
        _forged(events[1], events[0].chain_hash, f"sha256:{i:064x}") for i in range(MAX_COPIES + 1)
    ]
    head = events[-1]
    with pytest.raises(TooManyCopies, match="more than 16 different copies"):
        chained_references([*events, *copies], head.sequence, head.chain_hash)
    # Repeats of one copy are one copy.
    assert chained_references(events * 20, head.sequence, head.chain_hash) == [
        (2, events[1].payload_ref)
    ]
