"""Record → outbox → relay → Kafka on a real Postgres and a real broker."""

from __future__ import annotations

from collections import defaultdict

import pytest
from sqlalchemy import Engine, select, text

from agent_blackbox.consumers import events_index
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import GENESIS_CHAIN_HASH, EventType, Settings
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._kafka import murmur2_partition, read_topic
from tests.integration._views import build_views, view_runs

pytestmark = pytest.mark.integration

EVERY_BOUNDARY = {
    EventType.RUN_STARTED,
    EventType.TOOL_CALL,
    EventType.CLOCK_READ,
    EventType.LLM_CALL,
    EventType.STATE_TRANSITION,
    EventType.RANDOM_DRAW,
    EventType.EFFECT_INTENT,
    EventType.EFFECT_RECEIPT,
    EventType.RUN_FINISHED,
}


def _outbox_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one())


def test_recorded_runs_land_once_in_order_on_their_murmur2_partition(
    settings: Settings, engine: Engine
) -> None:
    recorder = Recorder(engine, settings=settings)
    recorded = record_ticket_runs(recorder, ticket_ids(30))
    total = sum(r.events for r in recorded)

    relay = Relay(engine, settings=settings)
    assert relay.drain(timeout=60) == total
    relay.close()
    relay.close()  # again, as a finally after run() does: nothing happens
    assert _outbox_rows(engine) == 0

    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=total)
    by_run: dict[str, list[int]] = defaultdict(list)
    types: set[str] = set()
    previous_hash: dict[str, str] = {}
    for partition, _, envelope in messages:
        assert partition == murmur2_partition(envelope.run_id.encode(), settings.partitions)
        by_run[envelope.run_id].append(envelope.sequence)
        types.add(envelope.event_type)
        prev = previous_hash.get(envelope.run_id, GENESIS_CHAIN_HASH)
        assert envelope.chain_hash == envelope.expected_chain_hash(prev)
        previous_hash[envelope.run_id] = envelope.chain_hash
    assert types == EVERY_BOUNDARY
    assert {r.run_id: list(range(1, r.events + 1)) for r in recorded} == dict(by_run)

    build_views(settings, engine, expect=total)
    assert view_runs(engine) == {
        r.run_id: ("succeeded", r.events, r.events, r.code_version) for r in recorded
    }
    with engine.connect() as conn:
        columns = ("run_id", "sequence", "partition", "offset")
        indexed = conn.execute(select(*(events_index.c[name] for name in columns))).all()
    where = {(e.run_id, e.sequence): (p, o) for p, o, e in messages}
    assert {(r, s): (p, o) for r, s, p, o in indexed} == where


def test_rolled_back_transaction_leaves_no_event_anywhere(
    settings: Settings, engine: Engine
) -> None:
    recorder = Recorder(engine, settings=settings)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.tickets (id text PRIMARY KEY, state text)"))
    kept = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="a")

    with engine.connect() as conn:
        tx = conn.begin()
        doomed = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="a", connection=conn)
        conn.execute(text("INSERT INTO public.tickets VALUES ('T-1', 'triaged')"))
        doomed.transition("triaged", state={"id": "T-1"}, connection=conn)
        with kept.joined(conn):
            kept.transition("triaged", state={"id": "T-1"})
        tx.rollback()

    # The run that survived carries on from its committed sequence, not the rolled-back one.
    kept.transition("closed", state={"id": "T-1"})
    kept.finish()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM public.tickets")).scalar_one() == 0
        assert (
            conn.execute(
                text("SELECT count(*) FROM blackbox.runs WHERE run_id = :r"), {"r": doomed.run_id}
            ).scalar_one()
            == 0
        )
    relay = Relay(engine, settings=settings)
    relay.drain(timeout=60)
    relay.close()
    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=3)
    assert {e.run_id for _, _, e in messages} == {kept.run_id}
    assert [e.sequence for _, _, e in messages] == [1, 2, 3]


def test_business_state_and_event_commit_together(settings: Settings, engine: Engine) -> None:
    recorder = Recorder(engine, settings=settings)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE public.orders (id text PRIMARY KEY, state text)"))
    run = recorder.start_run(RunSnapshot(code_version="v1"), agent_id="a")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO public.orders VALUES ('O-1', 'approved')"))
        run.transition("approved", state={"order": "O-1"}, connection=conn)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM public.orders")).scalar_one() == "approved"
        assert (
            conn.execute(
                text("SELECT max(sequence) FROM blackbox.outbox WHERE run_id = :r"),
                {"r": run.run_id},
            ).scalar_one()
            == 2
        )


def test_several_relays_share_shards_and_keep_order(settings: Settings, engine: Engine) -> None:
    recorder = Recorder(engine, settings=settings)
    recorded = record_ticket_runs(recorder, ticket_ids(20))
    total = sum(r.events for r in recorded)
    options = RelayOptions(batch_size=50, lease_ttl_s=5.0)
    first = Relay(engine, settings=settings, owner="relay-a", options=options)
    second = Relay(engine, settings=settings, owner="relay-b", options=options)
    assert len(first.rebalance()) == settings.outbox_shards
    assert second.rebalance() == []  # announced itself; every shard is still leased
    halves = first.rebalance(), second.rebalance()
    assert sorted(halves[0] + halves[1]) == list(range(settings.outbox_shards))
    assert len(halves[0]) == len(halves[1]) == settings.outbox_shards // 2
    while first.drain_once() + second.drain_once():
        pass
    assert _outbox_rows(engine) == 0
    assert first.published > 0
    assert second.published > 0
    first.close()
    second.close()
    messages = read_topic(settings.kafka_bootstrap, settings.topic, expect=total)
    seen: dict[str, list[int]] = defaultdict(list)
    for _, _, envelope in messages:
        seen[envelope.run_id].append(envelope.sequence)
    assert {r.run_id: list(range(1, r.events + 1)) for r in recorded} == dict(seen)
