"""The relay loop's waits after a round that went wrong."""

from __future__ import annotations

import logging

import pytest

from agent_blackbox.outbox.relay._backoff import Backoff
from agent_blackbox.outbox.relay._log import Repeated


def test_each_cause_doubles_its_wait_up_to_its_ceiling() -> None:
    errors, refusals, timeouts = Backoff(), Backoff(), Backoff()
    assert [errors.after_error() for _ in range(6)] == pytest.approx([0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert [refusals.after_refusal() for _ in range(7)] == pytest.approx(
        [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    )
    assert [timeouts.after_timeout() for _ in range(5)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 2.0])


def test_wrong_rounds_in_a_row_count_together_until_one_goes_right() -> None:
    backoff = Backoff()
    backoff.after_error()
    backoff.after_timeout()
    assert backoff.after_refusal() == pytest.approx(4.0)  # the third wrong round in a row
    backoff.reset()
    assert backoff.after_error() == pytest.approx(0.4)


def test_a_failure_that_repeats_is_one_warning_then_one_every_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Postgres away for a minute: the lease renewal fails every half heartbeat, and
    the log says so a few times, not hundreds."""
    repeated = Repeated("renew leases", every_s=30.0)
    with caplog.at_level(logging.INFO, logger="blackbox.relay"):
        for tick in range(120):  # every 0.5 s for 60 s
            repeated.failed("connection refused", now=tick * 0.5)
        repeated.failed("the database is starting up", now=60.0)  # a new reason is said
        repeated.succeeded(now=61.0)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "could not renew leases: connection refused",
        "could not renew leases: connection refused (61 tries failed in 30s)",
        "could not renew leases: the database is starting up (121 tries failed in 60s)",
        "could renew leases again after 121 failed tries in 61s",
    ]
    caplog.clear()
    repeated.failed("connection refused", now=100.0)
    assert [r.getMessage() for r in caplog.records] == [
        "could not renew leases: connection refused"
    ], "after a success, the next failure is a new one"
