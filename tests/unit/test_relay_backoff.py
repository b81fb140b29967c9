"""The relay loop's waits after a round that went wrong."""

from __future__ import annotations

import pytest

from agent_blackbox.outbox.relay._backoff import Backoff


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
