"""The relay's logger, shared by its parts: every line keeps the one name (``blackbox.relay``)
that operators filter on, and errors are quoted the same way everywhere."""

from __future__ import annotations

import logging

log = logging.getLogger("blackbox.relay")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (a driver's error goes on with SQL and links),
    or its type's name when it has no message."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class Repeated:
    """One warning for a failure that repeats, not one per try: the first failure is
    logged, the same failure again at most every ``every_s`` seconds with how many tries
    failed meanwhile, and the first success after it says how long it lasted."""

    def __init__(self, what: str, *, every_s: float = 30.0) -> None:
        self._what = what
        self._every_s = every_s
        self._since: float | None = None
        self._said_at = 0.0
        self._said: str | None = None
        self._tries = 0

    def failed(self, reason: str, now: float) -> None:
        """A try failed for ``reason``."""
        self._tries += 1
        if self._since is None:
            self._since = now
        if reason != self._said or now - self._said_at >= self._every_s:
            again = f" ({self._tries} tries failed in {now - self._since:.0f}s)"
            log.warning("could not %s: %s%s", self._what, reason, again if self._tries > 1 else "")
            self._said, self._said_at = reason, now
        else:
            log.debug("could not %s: %s", self._what, reason)

    def succeeded(self, now: float) -> None:
        """A try went right: say so if tries had been failing."""
        if self._since is not None:
            log.info(
                "could %s again after %d failed tries in %.0fs",
                self._what,
                self._tries,
                now - self._since,
            )
        self._since, self._said, self._tries = None, None, 0
