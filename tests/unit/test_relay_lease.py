"""The relay's lease deadline: when it may produce, when it must fence itself."""

from __future__ import annotations

import math
from typing import cast

import pytest
from confluent_kafka import KafkaError, Message
from sqlalchemy import Engine

from agent_blackbox.outbox.relay import Relay, RelayOptions
from agent_blackbox.outbox.relay._batch import Batch, Row, order_gaps
from agent_blackbox.outbox.relay._lease import LeaseDeadline, LeaseTiming


def test_default_timing_scales_with_the_lease() -> None:
    timing = LeaseTiming.for_ttl(2.0)
    assert (timing.heartbeat_s, timing.margin_s, timing.message_timeout_s) == pytest.approx(
        (0.4, 0.2, 1.0)
    )
    assert timing.message_timeout_ms == 1000
    # A relay renewing on time can always produce, with a heartbeat of slack.
    assert timing.heartbeat_s * 2 + timing.margin_s + timing.message_timeout_s <= timing.ttl_s


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.nan, math.inf])
def test_unusable_ttl_is_refused(ttl: float) -> None:
    with pytest.raises(ValueError, match="lease TTL"):
        LeaseTiming.for_ttl(ttl)


@pytest.mark.parametrize("heartbeat", [0.0, -0.1, 0.8, 1.5])
def test_heartbeat_that_leaves_no_time_to_produce_is_refused(heartbeat: float) -> None:
    with pytest.raises(ValueError, match=r"renew more often than every 0\.8 s"):
        LeaseTiming.for_ttl(2.0, heartbeat)


def test_nothing_may_be_produced_before_the_first_renewal() -> None:
    deadline = LeaseDeadline(LeaseTiming.for_ttl(2.0))
    assert not deadline.may_produce(0.0)
    assert deadline.expired(0.0)


def test_a_message_produced_in_the_window_settles_before_the_lease_can_move() -> None:
    timing = LeaseTiming.for_ttl(2.0)
    deadline = LeaseDeadline(timing)
    deadline.renewed(started_at=100.0)  # others may claim at 102.0 at the earliest
    assert deadline.may_produce(100.0)
    assert deadline.may_produce(100.79)
    assert not deadline.may_produce(100.8)  # 100.8 + 1.0 timeout + 0.2 margin = 102.0
    last = deadline.produce_until
    assert last + timing.message_timeout_s + timing.margin_s == pytest.approx(102.0)


def test_the_relay_fences_itself_a_margin_before_the_lease_ends() -> None:
    deadline = LeaseDeadline(LeaseTiming.for_ttl(2.0))
    deadline.renewed(started_at=100.0)
    assert not deadline.expired(101.79)
    assert deadline.expired(101.8)
    assert deadline.expired(105.0)
    deadline.renewed(started_at=101.5)  # a late renewal moves the deadline on
    assert not deadline.expired(103.0)
    assert deadline.may_produce(101.5)


def test_a_slow_renewal_counts_from_when_it_started() -> None:
    deadline = LeaseDeadline(LeaseTiming.for_ttl(2.0))
    # The renewing transaction started at 100 and returned at 101.9: the database's
    # expiry is no earlier than 102, so the relay may not produce any more.
    deadline.renewed(started_at=100.0)
    assert not deadline.may_produce(101.9)
    assert deadline.expired(101.9)


def test_lapse_forbids_producing_until_renewed() -> None:
    deadline = LeaseDeadline(LeaseTiming.for_ttl(2.0))
    deadline.renewed(started_at=100.0)
    deadline.lapse()
    assert not deadline.may_produce(100.0)
    assert deadline.expired(100.0)


def test_order_gaps_count_acknowledged_events_after_a_failed_one_of_their_run() -> None:
    rows = [(1, "a"), (2, "b"), (3, "a"), (4, "a"), (5, "b"), (6, "c")]
    # Run a: 1 failed, 3 and 4 acknowledged after it. Run b: 2 acked, 5 failed: no gap.
    # Row 6 was never produced (neither acked nor failed).
    assert order_gaps(rows, acked=[2, 3, 4], failed=[1, 5]) == 2
    assert order_gaps(rows, acked=[1, 2, 3, 4], failed=[5]) == 0
    assert order_gaps(rows, acked=[], failed=[1, 2, 3, 4, 5]) == 0


def test_relay_command_refuses_a_heartbeat_that_cannot_work() -> None:
    from click.testing import CliRunner

    from agent_blackbox.cli import main

    result = CliRunner().invoke(main, ["relay", "--lease-ttl", "2", "--heartbeat", "1.5"])
    assert result.exit_code == 2, result.output
    assert "renew more often than every 0.8 s" in result.output


class _Report:
    """A delivery report's message, as far as the relay reads it: like the real one of a
    failed delivery, it carries the key and value and no headers."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def headers(self) -> None:
        return None

    def key(self) -> bytes:
        return b"run"

    def value(self) -> bytes:
        return self._value


def _report(row_id: int) -> Message:
    return cast(Message, _Report(b"envelope-%d" % row_id))


def _rows(*ids: int) -> list[Row]:
    return [(i, b"run", b"event-%d" % i, b"envelope-%d" % i, 0.0, 0, 0) for i in ids]


def test_a_settled_batch_sorts_its_produced_rows_into_acked_and_failed() -> None:
    batch = Batch(rows=_rows(10, 11, 12, 13), produced=3, pending=3)  # 13 never produced
    batch.delivered(None, _report(10))
    batch.delivered(KafkaError(KafkaError._MSG_TIMED_OUT), _report(11))
    batch.delivered(None, _report(12))
    batch.settle()
    assert (batch.acked, batch.failed, batch.timed_out, batch.pending) == ([10, 12], [11], 1, 0)


def test_a_failed_report_marks_every_row_with_its_value_failed() -> None:
    rows = _rows(1, 2, 3)
    rows[2] = (3, b"run", b"event-1", b"envelope-1", 0.0, 0, 0)  # the event of row 1, again
    batch = Batch(rows=rows, produced=3, pending=3)
    batch.delivered(KafkaError(KafkaError._MSG_TIMED_OUT), _report(1))
    batch.delivered(None, _report(2))
    batch.delivered(None, _report(1))
    batch.settle()
    assert (batch.acked, batch.failed) == ([2], [1, 3])  # published again, never lost


def test_a_batch_cut_short_by_shutdown_deletes_nothing_unsettled() -> None:
    batch = Batch(rows=_rows(1, 2), produced=2, pending=2)
    batch.delivered(None, _report(1))
    batch.settle()  # one delivery still unconfirmed: nothing is known acknowledged
    assert (batch.acked, batch.failed) == ([], [])


def test_a_pipeline_without_batches_is_refused() -> None:
    with pytest.raises(ValueError, match="pipeline_batches"):
        Relay(cast(Engine, None), options=RelayOptions(pipeline_batches=0))
