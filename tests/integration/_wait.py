"""Waiting on conditions with a deadline, instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    probe: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something truthy, and return that.

    Raises:
        AssertionError: naming ``what`` and the last value, when ``timeout`` passes.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f}s (last: {last!r})")
        time.sleep(interval)  # polling interval of the deadline loop, not synchronisation
