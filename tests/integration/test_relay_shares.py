"""Fair shares of the outbox shards: relays joining and leaving, epochs raised per claim."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from agent_blackbox.outbox.relay import Relay
from agent_blackbox.schemas import Settings

pytestmark = pytest.mark.integration


def test_a_third_relay_joins_and_one_leaves(settings: Settings, engine: Engine) -> None:
    shards = settings.outbox_shards
    relays = [Relay(engine, settings=settings, owner=f"relay-{n}") for n in range(3)]
    try:
        first, second, third = relays
        assert first.rebalance() == list(range(shards))
        assert set(first.epochs.values()) == {1}  # the first claim of every shard
        second.rebalance()
        halves = first.rebalance(), second.rebalance()
        assert sorted(halves[0] + halves[1]) == list(range(shards))

        third.rebalance()  # joins: the others hand shards back towards a third each
        thirds = [r.rebalance() for r in relays]  # first and second hand back two each
        thirds = [r.rebalance() for r in relays]  # settled
        assert sorted(s for held in thirds for s in held) == list(range(shards))
        assert sorted(len(held) for held in thirds) == [4, 6, 6]
        moved = set(thirds[2])
        # A shard that changed hands carries a higher epoch than its first claim.
        assert all(third.epochs[s] >= 2 for s in moved)

        second.close()  # leaves: its shards are released, the others take them up
        left = [first.rebalance(), third.rebalance()]
        assert sorted(left[0] + left[1]) == list(range(shards))
        assert {len(held) for held in left} == {shards // 2}
    finally:
        for relay in relays:
            relay.close()
