"""One --metrics-port convention: served on loopback, a taken port is a clear error."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from agent_blackbox.cli._workers import serve_metrics
from agent_blackbox.schemas import BlackboxError


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_are_served_on_loopback() -> None:
    registry = CollectorRegistry()
    Counter("blackbox_test_things", "Things.", registry=registry).inc(3)
    port = _free_port()
    serve_metrics(port, registry)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert "blackbox_test_things_total 3.0" in answer.read().decode()


def test_a_taken_port_is_an_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(BlackboxError, match=f"127.0.0.1:{port}.*another --metrics-port"):
            serve_metrics(port, CollectorRegistry())


def test_no_port_serves_nothing() -> None:
    serve_metrics(None, CollectorRegistry())
