"""How fast a console token can be guessed: exponential back-off on failed sign-ins.

Each failed token (a sign-in form or a bearer header) counts against two keys: the
client's address, and the first :data:`PREFIX_CHARS` characters of the token it offered
(a guesser spread over many addresses that works on one known prefix is slowed as one).
After :data:`FREE_FAILURES` failures a key must wait before its next attempt is even
looked at: one second, then twice as long after each further failure, up to
:data:`MAX_WAIT_S`. While a key waits, *every* token it offers is refused, the right one
too: a guesser learns nothing by trying, and at most about
``FREE_FAILURES + log2(seconds)`` guesses per address go through in any stretch of time
(a dozen in the first ten minutes, then one per quarter of an hour). A key is forgotten
once it has waited out its last back-off and been quiet for :data:`FORGET_AFTER_S`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

FREE_FAILURES = 3
"""Failures a key may make before it has to wait (a person's typos)."""
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 15 * 60.0
PREFIX_CHARS = 6
"""How much of an offered token keys its own back-off (never the whole token)."""
FORGET_AFTER_S = 60 * 60.0
"""A quiet key's failures are forgotten this long after its back-off ended."""
MAX_KEYS = 10_000
"""Keys remembered at most; the longest-quiet go first (a flood of addresses cannot
grow the console's memory without bound)."""


@dataclass(slots=True)
class _Record:
    failures: int
    free_at: float
    """When the key may try again (monotonic seconds)."""
    last: float
    """Its last failure."""


class SignInThrottle:
    """Counts failed tokens per client address and per token prefix, and says how long
    each must wait before its next attempt.

    Args:
        clock: monotonic seconds (tests hand in their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()

    def wait(self, client: str, token: str) -> int:
        """Whole seconds ``client`` must wait before ``token`` is looked at (0: go ahead):
        the longer of the client's and the token prefix's back-off."""
        now = self._clock()
        with self._lock:
            due = max(
                (r.free_at for k in _keys(client, token) if (r := self._records.get(k))),
                default=now,
            )
        return math.ceil(due - now) if due > now else 0

    def failed(self, client: str, token: str) -> int:
        """Count a wrong ``token`` from ``client``; the seconds both must now wait."""
        now = self._clock()
        with self._lock:
            self._forget_quiet(now)
            waits = [self._count(key, now) for key in _keys(client, token)]
        return math.ceil(max(waits))

    def _count(self, key: str, now: float) -> float:
        record = self._records.pop(key, None) or _Record(0, now, now)
        record.failures += 1
        record.last = now
        over = record.failures - FREE_FAILURES
        if over > 0:
            # The exponent is capped: the wait reached its cap long before, and 2.0**1024
            # would overflow (a patient guesser fails that often in about ten days).
            record.free_at = now + min(FIRST_WAIT_S * 2.0 ** min(over - 1, 32), MAX_WAIT_S)
        self._records[key] = record  # most recent last: the quietest go first
        return max(record.free_at - now, 0.0)

    def _forget_quiet(self, now: float) -> None:
        while self._records:
            key, oldest = next(iter(self._records.items()))
            quiet = now - max(oldest.last, oldest.free_at) > FORGET_AFTER_S
            if not quiet and len(self._records) < MAX_KEYS:
                return
            del self._records[key]


def _keys(client: str, token: str) -> tuple[str, ...]:
    prefix = token[:PREFIX_CHARS]
    return (f"client {client}", f"prefix {prefix}") if prefix else (f"client {client}",)
