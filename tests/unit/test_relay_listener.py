"""The relay's listener, once woken, drops every notification that has reached its
connection, over as many reads of the socket as it takes (it took one packet's worth,
and a relay that had been busy while a per-event writer committed thousands of events
woke again and again on the rest), and never waits for more."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from agent_blackbox.outbox.relay import _listener


class _FakePGconn:
    """libpq's side: ``arriving`` packets of notifications, one taken per read."""

    def __init__(self, packets: list[int]) -> None:
        self.arriving = deque(packets)
        self.parsed = 0
        self.reads = 0

    def consume_input(self) -> None:
        self.reads += 1
        if self.arriving:
            self.parsed += self.arriving.popleft()

    def notifies(self) -> object | None:
        if self.parsed == 0:
            return None
        self.parsed -= 1
        return object()


class _FakeConnection:
    def __init__(self, pgconn: _FakePGconn) -> None:
        self.pgconn = pgconn
        self.lock = threading.Lock()


def test_every_notification_received_is_dropped_over_several_reads() -> None:
    pgconn = _FakePGconn([700, 700, 700, 1])
    _listener._discard_received(_FakeConnection(pgconn))  # type: ignore[arg-type]
    assert pgconn.parsed == 0
    assert not pgconn.arriving
    assert pgconn.reads == 5  # the four packets, then one read that found nothing


def test_nothing_received_costs_one_read() -> None:
    pgconn = _FakePGconn([])
    _listener._discard_received(_FakeConnection(pgconn))  # type: ignore[arg-type]
    assert pgconn.reads == 1


def test_writers_that_keep_notifying_cannot_hold_the_relay() -> None:
    endless: Any = _FakePGconn([1] * 10_000)
    _listener._discard_received(_FakeConnection(endless))  # type: ignore[arg-type]
    assert endless.reads == _listener._DRAIN_ROUNDS
