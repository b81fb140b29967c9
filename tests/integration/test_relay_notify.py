"""The relay wakes on the writers' NOTIFY instead of waiting for its polling interval."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.schemas import Settings
from tests.integration._wait import eventually

pytestmark = pytest.mark.integration

POLL_FALLBACK_S = 120.0


def test_idle_relay_wakes_on_notify_and_reports_metrics(settings: Settings, engine: Engine) -> None:
    relay = Relay(engine, settings=settings, options=RelayOptions(idle_wait_s=POLL_FALLBACK_S))
    stop = threading.Event()
    worker = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    worker.start()
    try:
        # Wait until the relay holds its shards and has gone idle on LISTEN.
        eventually(lambda: relay.idle, what="relay idle on LISTEN")
        run = Recorder(engine, settings=settings).start_run(
            RunSnapshot(code_version="v1"), agent_id="a"
        )
        run.finish()

        def drained() -> bool:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT count(*) FROM blackbox.outbox")).scalar_one()
            return rows == 0 and relay.published == 2

        # Far sooner than the polling fallback: only the notification can explain it.
        eventually(drained, timeout=POLL_FALLBACK_S / 4, what="events published after NOTIFY")
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    registry = relay.metrics.registry
    assert registry.get_sample_value("blackbox_events_published_total") == 2
    assert (registry.get_sample_value("blackbox_publish_latency_seconds_count") or 0) >= 1
    assert registry.get_sample_value("blackbox_outbox_depth") is not None
