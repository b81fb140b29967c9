"""A relay paused past its lease under load: no stale copy applied, none published late.

Two relays share the outbox while a writer records runs. Relay A stops itself (SIGSTOP)
in the middle of a large batch, with messages queued in its producer (a long
``linger.ms`` keeps them there). Relay B takes A's shards once A's lease runs out, with a
higher epoch, and publishes newer events of the same runs. Then A is continued. Without
the message timeout tied to the lease, and the purge when A finds its lease gone, A's
queued messages would be sent now, after B's. The test reads the whole topic and checks
(a) through an ``EpochFence`` every run's admitted events are its committed events in
sequence order, and (b) within a partition no message of a shard carries an older epoch
than one before it: nothing stale was published after the newer owner's events.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent_blackbox.broker import EpochFence
from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import Settings
from tests.integration import _relays
from tests.integration._agents import record_ticket_runs, ticket_ids
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    yield from _relays.processes()


def test_relay_paused_past_its_lease_publishes_nothing_stale(
    settings: Settings,
    engine: Engine,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    recorder = Recorder(engine, settings=settings)
    recorded = record_ticket_runs(recorder, ticket_ids(50), workers=4)  # a backlog
    writer = _relays.Writer(recorder, recorded, threading.Event())
    writer.start()
    try:
        a_log, b_log = tmp_path / "relay-a.log", tmp_path / "relay-b.log"
        a = _relays.spawn_pausing_relay(settings, "relay-a", a_log, pause_at=200, linger_ms=300)
        processes.append(a)
        eventually(lambda: _relays.is_stopped(a), timeout=60, what="relay A paused mid-batch")
        paused_at = _relays.last_outbox_id(engine)
        held = {s: e for s, (o, e) in _relays.leases(engine).items() if o == "relay-a"}
        assert held, "relay A held no shard when it paused"

        b = _relays.spawn_cli_relay(settings, "relay-b", b_log)
        processes.append(b)

        def b_took_over_and_published() -> bool:
            now = _relays.leases(engine)
            moved = all(now[s][0] == "relay-b" and now[s][1] > e for s, e in held.items())
            # B published what A had read (and queued) before it paused.
            return moved and _relays.outbox_rows(engine, sorted(held), paused_at) == 0

        eventually(b_took_over_and_published, timeout=60, what="relay B took A's shards")
        assert _relays.is_stopped(a), "relay A ran again before the test continued it"
        a.send_signal(signal.SIGCONT)
        # A comes back, finds its leases gone, fences itself and takes a fair share again.
        eventually(
            lambda: any(o == "relay-a" for o, _ in _relays.leases(engine).values()),
            timeout=60,
            what="relay A back with shards",
        )
    finally:
        writer.finish()
    eventually(lambda: _relays.outbox_rows(engine) == 0, timeout=120, what="outbox drained")
    for process in (a, b):
        process.send_signal(signal.SIGTERM)
    assert [p.wait(timeout=30) for p in (a, b)] == [0, 0]
    a_said = a_log.read_text()
    assert "pausing with" in a_said, a_said[-2000:]
    assert "stops publishing shards" in a_said, a_said[-2000:]  # it fenced itself

    total = sum(r.events for r in recorded)
    messages = _relays.read_published(settings, expect=total)

    # (b) Per partition and shard, epochs never go back in offset order.
    newest: dict[tuple[int, int], int] = {}
    late = []
    epochs_seen: dict[int, set[int]] = defaultdict(set)
    for m in messages:
        assert m.stamp is not None, f"message at {m.partition}:{m.offset} has no lease stamp"
        epochs_seen[m.stamp.shard].add(m.stamp.epoch)
        key = (m.partition, m.stamp.shard)
        if m.stamp.epoch < newest.get(key, -1):
            late.append((m.partition, m.offset, m.stamp))
        newest[key] = max(newest.get(key, -1), m.stamp.epoch)
    assert late == [], f"stale copies published after a newer owner's: {late[:5]}"
    # The pause really moved A's shards to a newer epoch that published.
    assert any(len(epochs_seen[s]) > 1 for s in held), epochs_seen

    # (a) What a fenced reader admits is every run's committed events, in order.
    fence = EpochFence()
    admitted: dict[str, list[int]] = defaultdict(list)
    event_ids: dict[tuple[str, int], str] = {}
    for m in messages:
        if not fence.admit(m.partition, m.headers):
            continue
        env = m.envelope
        first = event_ids.setdefault((env.run_id, env.sequence), str(env.event_id))
        assert first == str(env.event_id), f"two events at {env.run_id}#{env.sequence}"
        if env.sequence not in admitted[env.run_id]:
            admitted[env.run_id].append(env.sequence)
    assert dict(admitted) == {r.run_id: list(range(1, r.events + 1)) for r in recorded}
    print(f"{total} events, {len(messages) - total} duplicates, {fence.dropped} fenced off")
