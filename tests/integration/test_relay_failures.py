"""The relay under failure: SIGKILL mid-drain, and a broker that goes away."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text

from agent_blackbox.broker import read_stamp
from agent_blackbox.consumers import integrity_violations
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox import _writer as writer
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import EnvelopeCodec, Settings
from agent_blackbox.stack import LocalKafka
from tests.integration._agents import RecordedRun, record_ticket_runs, ticket_ids
from tests.integration._kafka import read_messages, read_topic
from tests.integration._views import build_views, view_runs
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _outbox_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one())


def _assert_complete_and_ordered(settings: Settings, recorded: list[RecordedRun]) -> int:
    """Every recorded event is in the topic, and each run's first copies are in order.

    Returns how many duplicates the topic holds.
    """
    total = sum(r.events for r in recorded)
    messages = read_messages(settings.kafka_bootstrap, settings.topic, expect=total)
    codec = EnvelopeCodec()
    firsts: dict[str, list[int]] = defaultdict(list)
    copies: dict[str, list[str]] = defaultdict(list)
    seen: set[tuple[str, int]] = set()
    for message in messages:
        envelope = codec.decode(message.value())  # type: ignore[arg-type]
        key = (envelope.run_id, envelope.sequence)
        stamp = read_stamp(message.headers())
        lease = f"lease {stamp.shard}:{stamp.epoch}" if stamp else "no lease"
        at = f"{message.partition()}:{message.offset()}"
        copies[envelope.run_id].append(f"seq {envelope.sequence} at {at}, {lease}")
        if key not in seen:
            seen.add(key)
            firsts[envelope.run_id].append(envelope.sequence)
    expected = {r.run_id: list(range(1, r.events + 1)) for r in recorded}
    # A run out of order is shown whole: every copy, where it lies, which lease sent it.
    broken = {run: copies[run] for run, seqs in expected.items() if firsts.get(run) != seqs}
    assert expected == dict(firsts), f"runs out of order or incomplete: {broken}"
    return len(messages) - total


@pytest.fixture
def relay_process(settings: Settings) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def _spawn_relay(settings: Settings, relay_id: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable,
        "-m",
        "cli",
        "relay",
        "--relay-id",
        relay_id,
        "--batch-size",
        "200",
        "--lease-ttl",
        "2",
    ]
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)


def test_relay_killed_mid_drain_loses_nothing_and_keeps_order(
    settings: Settings, engine: Engine, relay_process: list[subprocess.Popen[bytes]]
) -> None:
    recorder = Recorder(engine, settings=settings)
    recorded = record_ticket_runs(recorder, ticket_ids(300), workers=6)
    total = sum(r.events for r in recorded)
    assert _outbox_rows(engine) == total

    first = _spawn_relay(settings, "relay-doomed")
    relay_process.append(first)
    eventually(lambda: 0 < _outbox_rows(engine) < total - 400, timeout=60, what="relay mid-drain")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    left = _outbox_rows(engine)
    assert left > 0, "the relay finished before it was killed; the test proves nothing"

    second = _spawn_relay(settings, "relay-successor")
    relay_process.append(second)
    eventually(lambda: _outbox_rows(engine) == 0, timeout=90, what="outbox drained after restart")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0

    duplicates = _assert_complete_and_ordered(settings, recorded)
    # The views absorb whatever the crash duplicated: one row per (run, sequence).
    build_views(settings, engine, expect=total)
    assert view_runs(engine) == {
        r.run_id: ("succeeded", r.events, r.events, r.code_version) for r in recorded
    }
    with engine.connect() as conn:
        violations = select(func.count()).select_from(integrity_violations)
        assert conn.execute(violations).scalar_one() == 0
    print(f"duplicates in the topic after SIGKILL: {duplicates}")


def test_broker_outage_keeps_agents_committing_and_drains_on_return(
    settings: Settings, engine: Engine, own_broker: LocalKafka
) -> None:
    settings = replace(settings, kafka_bootstrap=own_broker.bootstrap)
    recorder = Recorder(engine, settings=settings)
    before = record_ticket_runs(recorder, ticket_ids(20))
    relay = Relay(engine, settings=settings, options=RelayOptions(batch_size=100, idle_wait_s=0.2))
    stop = threading.Event()
    worker = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    worker.start()
    try:
        eventually(lambda: _outbox_rows(engine) == 0, timeout=60, what="first drain")

        own_broker.stop()
        during = record_ticket_runs(recorder, [f"T-{i:05d}" for i in range(100, 140)])
        waiting = sum(r.events for r in during)
        # The agents committed while the broker was away; the relay keeps every row.
        assert _outbox_rows(engine) == waiting
        assert worker.is_alive()

        own_broker.start()
        eventually(lambda: _outbox_rows(engine) == 0, timeout=120, what="drain after outage")
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    _assert_complete_and_ordered(settings, before + during)


def test_an_event_the_producer_refuses_waits_with_its_run_and_the_other_runs_go_on(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event larger than the topic takes (recorded before the recorder capped an
    envelope's size): the relay leaves it and its run's later events in the outbox,
    says so, and relays every other run; it does not stop."""
    recorder = Recorder(engine, settings=settings)
    monkeypatch.setattr(writer, "MAX_ENVELOPE_BYTES", 8 * 1024 * 1024)  # as before the cap
    with recorder.start_run(RunSnapshot(code_version="big"), agent_id="big") as run:
        run.transition("s" * 2_000_000, state={})  # a 2 MB label: over the producer's 1 MB
        run.transition("after", state={})
    monkeypatch.undo()
    big = run.run_id
    others = record_ticket_runs(recorder, ticket_ids(5))
    relay = Relay(engine, settings=settings, options=RelayOptions(batch_size=100, idle_wait_s=0.2))
    stop = threading.Event()
    worker = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    worker.start()

    def waiting() -> set[str]:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT DISTINCT run_id FROM blackbox.outbox")).scalars()
            return set(rows)

    try:
        eventually(lambda: waiting() == {big}, timeout=60, what="every other run relayed")
        assert worker.is_alive()
        # With only the refused run left, the relay reads again at the polling interval
        # (0.2 s here), not in a loop: a window of a second sees a handful of refusals.
        before = relay._publisher.refusals
        time.sleep(1.0)  # a window to count in, not a wait for something to happen
        assert relay._publisher.refusals - before <= 15
        with engine.connect() as conn:
            left = conn.execute(
                text("SELECT sequence FROM blackbox.outbox ORDER BY sequence")
            ).scalars()
            assert list(left) == [2, 3, 4]  # the big event, and its run's after it
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    messages = read_topic(
        settings.kafka_bootstrap, settings.topic, expect=1 + sum(r.events for r in others)
    )
    assert [e.sequence for _, _, e in messages if e.run_id == big] == [1]
