"""How long the relay's loop waits after a round that went wrong.

Each cause has its own pace: a database or Kafka that failed the round is tried again
soon, deliveries Kafka refused for good are not hammered, and deliveries that timed out
already waited a message timeout each. The wait doubles with every wrong round in a row
and starts over after a round that went right.
"""

from __future__ import annotations


class Backoff:
    """The waits of one loop, in seconds: call one ``after_*`` per wrong round and
    ``reset`` after a round that went right."""

    def __init__(self) -> None:
        self._failures = 0

    def after_error(self) -> float:
        """The database or Kafka failed the round: 0.4 s, doubling up to 5 s."""
        return self._next(0.2, 5.0)

    def after_refusal(self) -> float:
        """Kafka refused deliveries for good (topic deleted, not authorised): their rows
        stay; 1 s, doubling up to 30 s, instead of hammering the broker."""
        return self._next(0.5, 30.0)

    def after_timeout(self) -> float:
        """Deliveries timed out (Kafka slow or away): each try already waited a message
        timeout; 0.2 s, doubling up to 2 s."""
        return self._next(0.1, 2.0)

    def reset(self) -> None:
        """A round went right: the next wrong one waits the least again."""
        self._failures = 0

    def _next(self, base: float, most: float) -> float:
        self._failures += 1
        return min(base * 2.0**self._failures, most)
