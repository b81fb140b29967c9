"""Riding out an outage of the backup store: back-off, gauges, a line a minute, giving up."""

from __future__ import annotations

import logging

import pytest

from agent_blackbox.backup import BackupMetrics, StoreUnreachable
from agent_blackbox.backup._outage import RetryPolicy, StoreOutage, StoreOutageTooLong
from agent_blackbox.cli.commands.backup import _SPAN

TOPIC = {"topic": "t"}


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _outage(policy: RetryPolicy) -> tuple[StoreOutage, BackupMetrics, _Clock]:
    metrics, clock = BackupMetrics(topic="t"), _Clock()
    return StoreOutage(policy, metrics, store="s3://b/", clock=clock), metrics, clock


def _gauges(metrics: BackupMetrics) -> tuple[float | None, float | None]:
    registry = metrics.registry
    return (
        registry.get_sample_value("blackbox_backup_store_up", TOPIC),
        registry.get_sample_value("blackbox_backup_store_outage_seconds", TOPIC),
    )


def test_the_back_off_doubles_up_to_its_cap() -> None:
    policy = RetryPolicy(first_s=1, cap_s=30)

    assert [policy.wait_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_the_gauges_show_the_outage_and_its_end(caplog: pytest.LogCaptureFixture) -> None:
    outage, metrics, clock = _outage(RetryPolicy(give_up_after_s=600))
    assert _gauges(metrics) == (1, 0)

    with caplog.at_level(logging.WARNING):
        assert outage.failed(StoreUnreachable("refused")) == 1
        clock.now += 15
        outage.tick()
        assert _gauges(metrics) == (0, 15)
        outage.succeeded()

    assert _gauges(metrics) == (1, 0)
    assert not outage.active
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("backup store unreachable, retrying with back-off")
    assert "giving up after 10 min" in said[0]
    assert said[-1].startswith("backup store reachable again after 15 s")


def test_one_line_a_minute_of_outage(caplog: pytest.LogCaptureFixture) -> None:
    outage, _metrics, clock = _outage(RetryPolicy(give_up_after_s=3600))
    with caplog.at_level(logging.WARNING):
        outage.failed(StoreUnreachable("refused"))
        for _ in range(1, 181):  # three minutes, a tick a second
            clock.now += 1
            outage.tick()

    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4  # the first failure, then one a minute
    assert "unreachable for 1 min (since" in said[1]
    assert "unreachable for 3 min" in said[3]
    assert "giving up in 57 min" in said[3]


def test_it_gives_up_after_the_time_given_saying_what_to_do() -> None:
    outage, _metrics, clock = _outage(RetryPolicy(first_s=1, cap_s=30, give_up_after_s=40))
    waits: list[float] = []

    def retry_until_given_up() -> None:
        while True:
            waits.append(outage.failed(StoreUnreachable("connection refused")))
            clock.now += waits[-1]

    with pytest.raises(StoreOutageTooLong) as raised:
        retry_until_given_up()

    assert waits == [1, 2, 4, 8, 16, 9]  # the last retry falls on the give-up time
    said = str(raised.value)
    assert "was unreachable for 40 s" in said
    assert "connection refused" in said
    assert "start `blackbox backup run` again" in said


def test_other_failures_back_off_without_counting_an_outage() -> None:
    outage, metrics, _clock = _outage(RetryPolicy(first_s=2, cap_s=5))

    assert [outage.other_failure() for _ in range(3)] == [2, 4, 5]
    assert not outage.active
    assert _gauges(metrics) == (1, 0)


@pytest.mark.parametrize(
    ("given", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0)]
)
def test_give_up_after_takes_seconds_or_a_unit(given: str, seconds: float) -> None:
    assert _SPAN.convert(given, None, None) == seconds
