"""A relay killed (SIGKILL) under load: another relay takes its shards and drains them.

Two relays (``blackbox relay`` at the default lease settings) share the outbox while a
writer records runs. One is killed outright; the other must claim the dead relay's
shards with a higher epoch once its heartbeat stops, and publishing of those shards
resumes. How fast is measured by the bench (``python -m bench relay``), not asserted
here beyond a generous deadline. After the writer stops, the outbox drains and every
committed event is in the topic, each run's first copies in sequence order.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent_blackbox.outbox import Recorder
from agent_blackbox.schemas import Settings
from tests.integration import _relays
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    yield from _relays.processes()


def test_killed_relay_is_replaced_and_nothing_is_lost(
    settings: Settings,
    engine: Engine,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    recorder = Recorder(engine, settings=settings)
    recorded: list[_relays.RecordedRun] = []
    writer = _relays.Writer(recorder, recorded, threading.Event())
    writer.start()
    try:
        a = _relays.spawn_cli_relay(settings, "relay-a", tmp_path / "relay-a.log")
        b = _relays.spawn_cli_relay(settings, "relay-b", tmp_path / "relay-b.log")
        processes.extend([a, b])

        def shared() -> dict[int, int] | None:
            now = _relays.leases(engine)
            owners = {o for o, _ in now.values()}
            a_held = {s: e for s, (o, e) in now.items() if o == "relay-a"}
            return a_held if owners == {"relay-a", "relay-b"} else None

        held = eventually(shared, timeout=60, what="both relays holding shards")
        eventually(lambda: len(recorded) >= 8, timeout=60, what="runs recorded under load")
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        killed_at, last_id = time.monotonic(), _relays.last_outbox_id(engine)

        def taken_over() -> bool:
            now = _relays.leases(engine)
            return all(now[s][0] == "relay-b" and now[s][1] > e for s, e in held.items())

        eventually(taken_over, timeout=30, what="relay B holding the dead relay's shards")
        # Publishing of those shards resumed: what was committed before the kill is out.
        eventually(
            lambda: _relays.outbox_rows(engine, sorted(held), last_id) == 0,
            timeout=30,
            what="the dead relay's shards drained",
        )
        print(
            f"takeover and drain of the dead relay's shards: {time.monotonic() - killed_at:.1f} s"
        )
    finally:
        writer.finish()
    eventually(lambda: _relays.outbox_rows(engine) == 0, timeout=120, what="outbox drained")
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0

    total = sum(r.events for r in recorded)
    firsts: dict[str, list[int]] = defaultdict(list)
    seen: set[tuple[str, int]] = set()
    for m in _relays.read_published(settings, expect=total):
        key = (m.envelope.run_id, m.envelope.sequence)
        if key not in seen:
            seen.add(key)
            firsts[m.envelope.run_id].append(m.envelope.sequence)
    assert dict(firsts) == {r.run_id: list(range(1, r.events + 1)) for r in recorded}
