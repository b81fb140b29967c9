"""A bounded read (a run's stretch for replay, the topic for the ledger) with no broker
to read from says so within seconds, not at the end of its stall timeout."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from agent_blackbox.broker import KafkaUnavailable, read_ranges
from agent_blackbox.schemas import Settings


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_read_with_the_broker_unreachable_names_it_before_the_stall_timeout() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    settings = replace(Settings.from_env({}), kafka_bootstrap=bootstrap)
    with pytest.raises(KafkaUnavailable) as raised:
        # Thirty seconds of stall allowed: only the probe can say "cannot reach" sooner.
        list(read_ranges(settings, "blackbox.events", {0: (0, 5)}, timeout_s=30.0))
    message = str(raised.value)
    assert f"cannot reach Kafka at {bootstrap} to read blackbox.events" in message
    assert "stalled" not in message
    assert "BLACKBOX_KAFKA_BOOTSTRAP" in message
