"""``blackbox relay --until-idle``: when the watch beside the relay stops it."""

from __future__ import annotations

import threading

from rich.console import Console

from agent_blackbox.cli.commands.relay import _RelayWatch


class _FakeRelay:
    def __init__(self, *, idle: bool) -> None:
        self.published = 0
        self.idle = idle


def _watch(relay: _FakeRelay, limit: float | None) -> tuple[_RelayWatch, threading.Event]:
    stop = threading.Event()
    watch = _RelayWatch(relay, stop, limit, Console(quiet=True))  # type: ignore[arg-type]
    watch._STUCK_GRACE_S = 0.2
    return watch, stop


def test_an_idle_relay_is_stopped_after_the_limit() -> None:
    watch, stop = _watch(_FakeRelay(idle=True), 0.2)
    with watch:
        assert stop.wait(timeout=10)
    assert watch.idle == 0.2
    assert watch.stuck is None


def test_a_relay_that_cannot_publish_is_stopped_as_stuck() -> None:
    watch, stop = _watch(_FakeRelay(idle=False), 0.2)
    with watch:
        assert stop.wait(timeout=10)
    assert watch.idle is None
    assert watch.stuck is not None
    assert watch.stuck >= 0.4


def test_without_a_limit_the_relay_runs_on() -> None:
    watch, stop = _watch(_FakeRelay(idle=True), None)
    with watch:
        assert not stop.wait(timeout=0.5)
    assert watch.idle is None
    assert watch.stuck is None
