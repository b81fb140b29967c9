"""The counters ``bench.cpu`` reads (``bench._processes``): a process's CPU from
``/proc``, the process listening on a port, and the database backends told apart by
``application_name``. Figures are not checked here, only that each counter follows the
work it counts."""

from __future__ import annotations

import os
import socket
import time

import pytest
from sqlalchemy import create_engine, make_url, text

from bench import _processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _busy(seconds: float) -> None:
    until = time.process_time() + seconds
    while time.process_time() < until:
        sum(range(1000))


def test_cpu_seconds_follow_the_process_own_counter() -> None:
    before = _processes.cpu_seconds(os.getpid())
    _busy(0.3)
    assert _processes.cpu_seconds(os.getpid()) - before >= 0.25
    assert _processes.cpu_seconds(None) == 0.0


def test_the_listening_process_is_found_by_its_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert _processes.listening_pid(f"127.0.0.1:{port}") is None  # bound, not listening
        listener.listen()
        assert _processes.listening_pid(f"127.0.0.1:{port}") == os.getpid()


def test_backends_are_counted_by_application_name(database_url: str) -> None:
    named = make_url(database_url).update_query_dict({"application_name": "bench-cpu-test"})
    engine = create_engine(named, pool_size=1)
    try:
        with engine.connect() as conn, _processes.BackendSampler(database_url) as sampler:
            conn.execute(text("SELECT count(*) FROM generate_series(1, 3000000)")).scalar_one()
            first = sampler.split()
            conn.execute(text("SELECT 1")).scalar_one()
        assert first["bench-cpu-test"] >= 0.05  # the series was counted, to this backend
        assert sampler.by_application().get("bench-cpu-test", 0.0) < first["bench-cpu-test"]
    finally:
        engine.dispose()
