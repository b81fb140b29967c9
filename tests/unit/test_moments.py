"""Moments as typed: spans back from now in the units a command takes, or ISO times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_blackbox.schemas import moment


def test_a_span_is_back_from_now_in_the_units_given() -> None:
    before = datetime.now(UTC)
    at = moment(" 2h ", spans="mhd")
    assert (
        before - timedelta(hours=2, seconds=5)
        < at
        <= before - timedelta(hours=2) + timedelta(seconds=5)
    )
    with pytest.raises(ValueError, match="Invalid isoformat"):
        moment("2w", spans="mhd")  # not a unit of this command: read as a time, and refused
    assert moment("2w") < moment("13d")


def test_an_iso_time_without_a_zone_is_in_the_zone_given() -> None:
    assert moment("2026-12-01T10:00", naive=UTC) == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert moment("2026-12-01T10:00+01:00").utcoffset() == timedelta(hours=1)
    assert moment("2026-12-01T10:00").tzinfo is not None  # local time, made explicit


@pytest.mark.parametrize("raw", ["99999999999d", "²h", "1 h", "", "yesterday"])
def test_what_is_no_moment_is_a_value_error(raw: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each raw fails its own way
        moment(raw)
