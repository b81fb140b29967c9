"""Riding out an outage of the backup store: when to try a failed cut again, what to say
while the store is away, and when to stop waiting.

A cut that failed is tried again with a capped exponential back-off (1, 2, 4 ... s up
to a cap). While the store cannot be reached, the writer's gauges say so (store up 0,
seconds of the current outage), one log line a minute says for how long, and after
``give_up_after_s`` of continuous outage the writer stops with
:class:`StoreOutageTooLong` (the command exits 2), leaving what it had not written for
the next start to read again. Nothing here sleeps: the writer asks when to retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_blackbox.backup._errors import BackupError
from agent_blackbox.backup._metrics import BackupMetrics
from agent_blackbox.backup._store import StoreUnreachable

# The writer's log lines keep its logger's name.
log = logging.getLogger("agent_blackbox.backup._writer")

GIVE_UP_ENV = "BLACKBOX_BACKUP_GIVE_UP_AFTER"
"""How long ``blackbox backup run`` waits for an unreachable store before it exits 2."""

DEFAULT_GIVE_UP_S = 15 * 60.0


class StoreOutageTooLong(BackupError):
    """The backup store stayed unreachable longer than the writer was told to wait."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a backup writer retries a failed cut and how long it waits for the store."""

    first_s: float = 1.0
    """The wait after the first failure; it doubles with each failure in a row..."""
    cap_s: float = 10.0
    """...up to this."""
    give_up_after_s: float = DEFAULT_GIVE_UP_S
    """Stop once the store was unreachable this long without a break."""
    say_every_s: float = 60.0
    """One log line per this much outage."""

    def __post_init__(self) -> None:
        if self.first_s <= 0 or self.cap_s < self.first_s or self.give_up_after_s <= 0:
            raise ValueError(
                "a retry policy needs first_s > 0, cap_s >= first_s and give_up_after_s > 0"
            )

    def wait_s(self, failures: int) -> float:
        """The wait after ``failures`` failed attempts in a row (1 or more)."""
        return min(self.cap_s, self.first_s * float(2 ** min(failures - 1, 32)))


class StoreOutage:
    """The current outage of one writer's store, if any (see the module).

    Args:
        policy: back-off, give-up time and log rate.
        metrics: the writer's metrics (store up, seconds of outage).
        store: the store's description, for messages.
        clock: monotonic seconds (a test may pass its own).
    """

    def __init__(
        self,
        policy: RetryPolicy,
        metrics: BackupMetrics,
        *,
        store: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._metrics = metrics
        self._store = store
        self._clock = clock
        self._began: float | None = None
        self._began_at: datetime | None = None
        self._said_at = 0.0
        self._failures = 0
        self._last = ""
        metrics.store_outage(up=True, seconds=0.0)

    @property
    def active(self) -> bool:
        """Whether the store is unreachable now (as far as the last attempt knows)."""
        return self._began is not None

    @property
    def seconds(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        return 0.0 if self._began is None else self._clock() - self._began

    def failed(self, exc: StoreUnreachable) -> float:
        """An attempt failed because the store could not be reached: the seconds to
        wait before the next one.

        Raises:
            StoreOutageTooLong: the outage has lasted ``give_up_after_s``.
        """
        now = self._clock()
        self._failures += 1
        self._last = str(exc)
        if self._began is None:
            self._began, self._began_at, self._said_at = now, datetime.now(UTC), now
            log.warning(
                "backup store unreachable, retrying with back-off (giving up after %s): %s",
                _duration(self._policy.give_up_after_s),
                exc,
            )
        self.tick()
        if now - self._began >= self._policy.give_up_after_s:
            raise StoreOutageTooLong(self._gave_up()) from exc
        wait = self._policy.wait_s(self._failures)
        # The last attempt falls on the give-up time, not a back-off step after it.
        return max(0.0, min(wait, self._began + self._policy.give_up_after_s - now))

    def other_failure(self) -> float:
        """An attempt failed for another reason (database, broker): the seconds to wait
        before the next one (the same back-off; no outage of the store is counted)."""
        self._failures += 1
        return self._policy.wait_s(self._failures)

    def succeeded(self) -> None:
        """An attempt succeeded: an outage, if any, is over."""
        if self._began is not None:
            log.warning(
                "backup store reachable again after %s; the backup goes on from where it was",
                _duration(self.seconds),
            )
        self._began = self._began_at = None
        self._failures = 0
        self._metrics.store_outage(up=True, seconds=0.0)

    def tick(self) -> None:
        """Bring the gauges up to date, and say once a minute that the store is away."""
        if self._began is None:
            return
        now = self._clock()
        self._metrics.store_outage(up=False, seconds=now - self._began)
        if now - self._said_at >= self._policy.say_every_s:
            self._said_at = now
            left = self._policy.give_up_after_s - (now - self._began)
            log.warning(
                "backup store unreachable for %s (since %s), still retrying; giving up in %s: %s",
                _duration(now - self._began),
                self._since(),
                _duration(max(0.0, left)),
                self._last,
            )

    def _gave_up(self) -> str:
        return (
            f"the backup store {self._store} was unreachable for "
            f"{_duration(self.seconds)} (since {self._since()}; last error: {self._last}), "
            f"longer than {GIVE_UP_ENV} / --give-up-after allows "
            f"({_duration(self._policy.give_up_after_s)}). Nothing written is lost and "
            "nothing read is skipped: the next start goes on from the newest cut. Bring "
            "the store back (or check BLACKBOX_BACKUP_URL), then start `blackbox backup run` "
            "again"
        )

    def _since(self) -> str:
        began = self._began_at or datetime.now(UTC)
        return began.isoformat(timespec="seconds")


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
