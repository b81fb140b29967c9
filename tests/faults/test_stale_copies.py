"""How the after-heal check tells a stale publisher's copies from a crash's republish
(no service needed)."""

from __future__ import annotations

import pytest

from tests.faults._check import _stale_copies


@pytest.mark.parametrize(
    ("sequences", "stale"),
    [
        ([1, 2, 3, 4], 0),
        # A successor republishes what the killed relay had not deleted: the block of
        # repeats ends at the newest sequence, then the run goes on.
        ([1, 2, 3, 4, 2, 3, 4, 5, 6], 0),
        # Partly sent before the kill: the repeats end where the topic had got to.
        ([1, 2, 3, 2, 3, 4, 5], 0),
        # A paused relay's queue lands after the new owner published newer events.
        ([1, 2, 3, 4, 5, 6, 3, 4], 2),
        ([1, 2, 3, 4, 5, 6, 3, 4, 7, 5], 3),
    ],
)
def test_stale_copies_are_repeats_that_end_below_the_newest(
    sequences: list[int], stale: int
) -> None:
    assert _stale_copies(sequences) == stale
