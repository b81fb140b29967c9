"""Which bodies a run's genuine events name, proven by their chain.

A run's events are chained: each one's chain hash covers the previous one's and its
own envelope (its ``payload_ref`` included). Given the head the write side recorded
for the run (its last sequence and chain hash at some moment), the envelopes that lead
from the genesis hash to that head are the ones its writer appended, whatever else was
produced to the topic beside them: a forged copy of an event cannot lie on that path
without a SHA-256 collision. The views are no proof of this (they keep the first copy
they were given and compare the head's chain hash as a field, not as computed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    BlackboxError,
    Envelope,
    UnknownCanonicalisation,
    next_chain_hash,
)

MAX_COPIES = 16
"""Copies of one event looked at: a relay leaves a few (a retry, a crash); more were
produced by someone else, and following each of them costs a hash for every hash
reached before it (many thousands make it hours)."""


class TooManyCopies(BlackboxError):
    """An event has more copies in the topic than a relay leaves: the run is not proven."""


def chained_references(
    copies: Iterable[Envelope], last_sequence: int, chain_head: str
) -> list[tuple[int, str]] | None:
    """``(sequence, payload_ref)`` of each event from 1 to ``last_sequence`` that stores
    its body out of line, along the chain of ``copies`` (every copy the topic holds,
    forged ones included) that leads from the genesis hash to ``chain_head``; None when
    no such chain is among them (an event missing, or only copies that do not chain).

    Raises:
        TooManyCopies: an event has more than :data:`MAX_COPIES` distinct copies.
    """
    # Each distinct copy with its chain material, taken once (every hash reached before
    # it is tried against it).
    by_sequence: dict[int, dict[bytes, tuple[Envelope, bytes]]] = defaultdict(dict)
    for envelope in copies:
        if 1 <= envelope.sequence <= last_sequence:
            try:
                material = envelope.chain_material()
            except (UnknownCanonicalisation, ValueError):
                continue  # a copy that names no canonicalisation known here
            same = by_sequence[envelope.sequence]
            same.setdefault(material + envelope.chain_hash.encode(), (envelope, material))
            if len(same) > MAX_COPIES:
                raise TooManyCopies(
                    f"event {envelope.sequence} of run {envelope.run_id} has more than "
                    f"{MAX_COPIES} different copies in the topic (a relay leaves a few): "
                    "someone else produced them; `blackbox verify` shows the run"
                )
    # Every chain hash reachable so far, with the references along its path.
    reached: dict[str, list[tuple[int, str]]] = {GENESIS_CHAIN_HASH: []}
    for sequence in range(1, last_sequence + 1):
        following: dict[str, list[tuple[int, str]]] = {}
        for envelope, material in by_sequence[sequence].values() if sequence in by_sequence else ():
            for previous, refs in reached.items():  # hashes computed here: hex
                computed = next_chain_hash(previous, material)
                if computed != envelope.chain_hash:
                    continue
                ref = envelope.payload_ref
                following[computed] = refs if ref is None else [*refs, (sequence, ref)]
        if not following:
            return None
        reached = following
    return reached.get(chain_head)
