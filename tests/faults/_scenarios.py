"""The fault scenarios, each a function of the stack and an event count.

The tests run each once over a few thousand events; ``make soak`` runs the same
functions over a million events in all. A scenario repeats its fault every
:data:`ROUND_EVENTS` events (at least once), then stops the load, heals, and ends with
the after-heal check (:func:`tests.faults._check.after_heal`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer
from sqlalchemy import create_engine, make_url, text

from agent_blackbox.broker import new_admin, partition_of
from agent_blackbox.outbox import Recorder, RunSnapshot
from tests.faults._check import Figures, after_heal, stale_so_far, takeover, waited
from tests.faults._harness import FaultStack, Load, Scenario, Worker, eventually, scenario
from tests.integration._pgproxy import CommitDropper, through

ROUND_EVENTS = 10_000
LEASE_TTL_S = 2.0

ScenarioFn = Callable[[FaultStack, Path, int], Figures]


def _rounds(events: int) -> list[int]:
    """The events to write before each fault: ``events`` split in rounds."""
    count = max(1, events // ROUND_EVENTS)
    return [events // count] * count


def _run(
    stack: FaultStack,
    log_dir: Path,
    name: str,
    events: int,
    body: Callable[[Scenario, Figures, int], None],
    *,
    relays: tuple[str, ...] = ("relay-1",),
    lease_ttl: float = LEASE_TTL_S,
) -> Figures:
    """The common frame: a consumer and relays up, then ``body`` (which drives the load
    and the faults), then the after-heal check."""
    figures = Figures(scenario=name)
    started = time.monotonic()
    with scenario(stack, name, log_dir) as current:
        current.consumer("views-1")
        for relay_id in relays:
            current.relay(relay_id, lease_ttl=lease_ttl)
        body(current, figures, events)
        figures.notes["load_s"] = round(time.monotonic() - started, 1)
        after_heal(current, figures)
    figures.duration_s = time.monotonic() - started
    return figures


def _loaded(
    current: Scenario,
    figures: Figures,
    events: int,
    fault: Callable[[int, Load], None],
    *,
    writers: int = 3,
) -> None:
    """Writers record ``events`` events; ``fault(round, load)`` is called half-way
    through each round while they keep writing."""
    load = current.load(writers=writers).start()
    target = 0
    try:
        # Faults start once the whole pipeline runs (a consumer that cannot reach the
        # database at start-up exits 2 by design; that is not the fault under test).
        waited(current, lambda: current.indexed() > 0, timeout=120, what="the pipeline running")
        for number, size in enumerate(_rounds(events)):
            load.wait_events(target + size // 2, timeout=300)
            fault(number, load)
            target += size
            load.wait_events(target, timeout=300)
    finally:
        load.stop()
        figures.writer_failures = load.failures
        if load.errors:
            figures.notes["writer_errors"] = load.errors[:5]


def relay_kill(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """One of two relays is killed (SIGKILL) under load: the survivor takes over all
    shards (the takeover time), then a fresh relay joins for the next round."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        live = {"relay-1": current.workers[1], "relay-2": current.workers[2]}

        def fault(number: int, load: Load) -> None:
            doomed, survivor = sorted(live)[:2]
            eventually(lambda: current.shards_held(doomed) > 0, timeout=30, what="both hold")
            live.pop(doomed).kill()
            killed_at = time.monotonic()
            figures.takeovers_s.append(takeover(current, survivor, since=killed_at))
            fresh = f"relay-{number + 3}"
            live[fresh] = current.relay(fresh, lease_ttl=LEASE_TTL_S)

        _loaded(current, figures, events, fault)

    return _run(stack, log_dir, "relay_kill", events, body, relays=("relay-1", "relay-2"))


def two_relays(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """Two relays share the shards; one leaves (SIGTERM) and comes back under load."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        def fault(number: int, load: Load) -> None:
            first = current.workers[1]
            eventually(lambda: current.shards_held("relay-a") > 0, timeout=30, what="a holds")
            assert first.terminate() == 0, f"relay-a exited badly, see {first.log}"
            current.workers[1] = current.relay("relay-a", lease_ttl=LEASE_TTL_S)
            current.workers.append(first)  # still closed at the end

        _loaded(current, figures, events, fault)
        eventually(
            lambda: current.shards_held("relay-a") > 0 and current.shards_held("relay-b") > 0,
            timeout=30,
            what="both relays hold shards",
        )

    return _run(stack, log_dir, "two_relays", events, body, relays=("relay-a", "relay-b"))


MAX_PAUSES = 6


def paused_relay(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """One of two relays is paused (SIGSTOP) past its lease under load, then resumed:
    the other takes its shards, and what the paused one had queued must not be applied
    anywhere. (What its producer had queued at the pause may still be published after
    the newer events: every reader's epoch fence drops it.)

    A pause proves something only when the relay had deliveries queued at that moment,
    which is a matter of timing: each round pauses again (at most :data:`MAX_PAUSES`
    times) until a copy was published after newer events, or the limit is reached.
    """

    def body(current: Scenario, figures: Figures, events: int) -> None:
        paused = current.workers[1]

        def fault(number: int, load: Load) -> None:
            for _ in range(MAX_PAUSES):
                _pause_once(current, paused, figures)
                figures.notes["pauses"] = figures.notes.get("pauses", 0) + 1
                if stale_so_far(current) > 0:
                    return

        _loaded(current, figures, events, fault)

    return _run(stack, log_dir, "paused_relay", events, body, relays=("relay-a", "relay-b"))


STALL_S = 15.0


def _pause_once(current: Scenario, paused: Worker, figures: Figures) -> None:
    """Pause relay-a until relay-b took its shards and published past it, then resume.

    A takeover the paused relay stalls (the new owner cannot claim every shard, or holds
    them but cannot shrink the outbox, within :data:`STALL_S`: the paused relay's open
    transaction keeps its locks) is counted in ``notes["stalled_takeovers"]``; the pause
    then ends anyway.
    """
    eventually(lambda: current.shards_held("relay-a") > 0, timeout=30, what="relay-a holds")
    paused.pause()
    stopped_at = time.monotonic()
    try:
        figures.takeovers_s.append(
            takeover(current, "relay-b", since=stopped_at, timeout=STALL_S + LEASE_TTL_S)
        )
        waiting = current.outbox_rows()
        eventually(
            lambda: current.outbox_rows() < waiting or waiting == 0,
            timeout=STALL_S,
            what="relay-b publishing",
        )
    except AssertionError:
        figures.notes["stalled_takeovers"] = figures.notes.get("stalled_takeovers", 0) + 1
    finally:
        paused.resume()
    # Back in the game once its deliveries settled: what it had queued has landed.
    eventually(lambda: current.shards_held("relay-a") > 0, timeout=60, what="relay-a back")


def broker_kill(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """Kafka is killed (SIGKILL) under load; writers go on; it is started again."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        def fault(number: int, load: Load) -> None:
            eventually(lambda: current.indexed() > 0, timeout=60, what="first events viewed")
            stack.kafka.kill()
            waiting = current.outbox_rows()
            eventually(
                lambda: current.outbox_rows() > waiting + 200, timeout=60, what="outbox growing"
            )
            load.hold()  # enough waits for the broker: the outage need not grow the history
            restarted = time.monotonic()
            stack.kafka.start()
            load.release()
            peak = current.outbox_rows()
            eventually(lambda: current.outbox_rows() < peak, timeout=120, what="relay resumed")
            figures.takeovers_s.append(time.monotonic() - restarted)

        _loaded(current, figures, events, fault)

    return _run(stack, log_dir, "broker_kill", events, body)


def postgres_stop(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """Postgres stops immediately (no checkpoint) under load and starts again."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        load_failures: list[int] = []

        def fault(number: int, load: Load) -> None:
            failures = load.failures
            stack.postgres_immediate_stop()
            stopped_at = time.monotonic()
            eventually(lambda: load.failures > failures, timeout=60, what="writers failing")
            stack.postgres.start()
            figures.takeovers_s.append(time.monotonic() - stopped_at)
            load_failures.append(number)

        _loaded(current, figures, events, fault)
        figures.notes["restarts"] = len(load_failures)

    return _run(stack, log_dir, "postgres_stop", events, body)


def consumer_kill(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """The view consumer is killed (SIGKILL) mid-batch and a new one resumes its group."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        live = [current.workers[0]]

        def fault(number: int, load: Load) -> None:
            before = current.indexed()
            eventually(lambda: current.indexed() > before, timeout=60, what="consumer busy")
            dead = set(_members(current))
            live[0].kill()
            killed_at = time.monotonic()
            live[0] = current.consumer(f"views-{number + 2}")
            load.hold()  # while the group waits for the dead member: no need to grow
            try:
                eventually(
                    lambda: (now := _members(current)) and not dead & set(now),
                    timeout=120,
                    what="the new consumer alone in the group",
                    interval=0.5,
                )
            finally:
                load.release()
            after = current.indexed()
            eventually(lambda: current.indexed() > after, timeout=60, what="consumer resumed")
            figures.takeovers_s.append(time.monotonic() - killed_at)

        _loaded(current, figures, events, fault)

    return _run(stack, log_dir, "consumer_kill", events, body)


def _members(current: Scenario) -> list[str]:
    """The member ids of the view consumers' group that hold partitions."""
    admin = new_admin(current.settings.kafka_bootstrap)
    group = current.settings.consumer_group
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return [m.member_id for m in description.members if m.assignment.topic_partitions]


HOLD_S = 5.0


def held_transaction(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """A recorder transaction (a run's event in the caller's transaction) stays open
    for :data:`HOLD_S` while the other writers commit newer outbox rows."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        recorder = Recorder(current.engine, settings=current.settings)

        def fault(number: int, load: Load) -> None:
            run = recorder.start_run(RunSnapshot("faults.held"), agent_id="fault-agent")
            with current.engine.begin() as conn, run.joined(conn):
                run.now()
                # Held open while the other writers commit newer outbox rows (and the
                # relay publishes them) for at least HOLD_S.
                until, written = time.monotonic() + HOLD_S, load.events
                eventually(
                    lambda: time.monotonic() >= until and load.events > written + 100,
                    timeout=HOLD_S + 60,
                    what="others committing while a transaction is held",
                    interval=0.2,
                )
            run.finish(output={"held": HOLD_S})
            figures.notes["held_runs"] = number + 1

        _loaded(current, figures, events, fault)

    return _run(stack, log_dir, "held_transaction", events, body)


POISON = {
    "random bytes": bytes(range(256)) * 3,
    "wrong fingerprint": b"\xc3\x01" + b"\x00" * 8 + b"\x02\x04",
    "empty value": b"",
    "truncated avro": None,  # filled from a real message at run time
}


def poison(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """Messages that are not envelopes land on the topic under the keys of real runs."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        settings = current.settings

        def fault(number: int, load: Load) -> None:
            eventually(lambda: current.indexed() > 0, timeout=60, what="first events viewed")
            with current.engine.connect() as conn:
                # Runs still being written: the poison lands between their events.
                query = text("SELECT run_id FROM blackbox.runs WHERE status = 'running' LIMIT 4")
                run_ids = [str(r[0]) for r in conn.execute(query)]
            producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
            values = dict(POISON)
            values["truncated avro"] = _truncated_envelope(current)
            for (_, value), run_id in zip(values.items(), run_ids * 4, strict=False):
                key = run_id.encode()
                producer.produce(
                    settings.topic,
                    key=key,
                    value=value,
                    partition=partition_of(key, settings.partitions),
                )
            assert producer.flush(30) == 0, "poison not delivered"
            figures.notes["poison"] = len(values) + figures.notes.get("poison", 0)

        _loaded(current, figures, events, fault)

    return _run(stack, log_dir, "poison", events, body)


def _truncated_envelope(current: Scenario) -> bytes:
    """The first half of a real envelope still in the outbox (or a made-up prefix)."""
    with current.engine.connect() as conn:
        row = conn.execute(text("SELECT envelope FROM blackbox.outbox LIMIT 1")).first()
    data = bytes(row[0]) if row is not None else b"\xc3\x01" + b"\x01" * 40
    return data[: len(data) // 2]


CUT_EVERY = 50


def ambiguous_commit(stack: FaultStack, log_dir: Path, events: int) -> Figures:
    """Writers reach Postgres through a proxy that drops the connection right after
    every :data:`CUT_EVERY`-th COMMIT: the database committed, the writer heard an error."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        url = make_url(current.settings.database_url)
        proxy = CommitDropper(url.host or "127.0.0.1", url.port or 5432)
        proxy.cut_every(CUT_EVERY)
        engine = create_engine(through(url, proxy), pool_size=8, max_overflow=8)
        try:
            load = current.load(engine=engine).start()
            try:
                load.wait_events(events, timeout=max(300.0, events / 10))
            finally:
                load.stop()
            figures.writer_failures = load.failures
            figures.notes["cuts"] = proxy.cuts
            assert proxy.cuts > 0, "no commit was cut: the scenario proves nothing"
        finally:
            engine.dispose()
            proxy.stop()

    return _run(stack, log_dir, "ambiguous_commit", events, body)


SCENARIOS: dict[str, ScenarioFn] = {
    "relay_kill": relay_kill,
    "two_relays": two_relays,
    "paused_relay": paused_relay,
    "broker_kill": broker_kill,
    "postgres_stop": postgres_stop,
    "consumer_kill": consumer_kill,
    "held_transaction": held_transaction,
    "poison": poison,
    "ambiguous_commit": ambiguous_commit,
}
