"""How a consumer told to stop when idle (``--until-idle``) knows that it is idle."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("agent_blackbox.consumers._runtime")

_WAITING_NOTE_EVERY_S = 10.0


class Assignee(Protocol):
    """What the clock asks of a consumer."""

    name: str

    @property
    def assigned(self) -> list[tuple[str, int]]:
        """The partitions the consumer holds now."""
        ...

    def lag(self) -> int | None:
        """Messages of the assigned partitions not yet applied; None when unknown."""
        ...


class IdleClock:
    """When a consumer's ``run`` may stop for idleness: time counts only while partitions
    are assigned, and a spell of ``max_idle_s`` ends the run only when the high
    watermarks show nothing left to read."""

    def __init__(
        self,
        runtime: Assignee,
        max_idle_s: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runtime = runtime
        self._max_idle_s = max_idle_s
        self._clock = clock
        self._since: float | None = None
        self._noted = clock()
        self.drained: list[tuple[str, int]] = []
        """The partitions read to their end when :meth:`finished` said to stop."""

    def reset(self) -> None:
        """Something was consumed."""
        self._since = None

    def finished(self) -> bool:
        """Called after an empty poll: whether the run should stop now."""
        if self._max_idle_s is None:
            return False
        now, name = self._clock(), self._runtime.name
        if not self._runtime.assigned:
            self._since = None
            if now - self._noted >= _WAITING_NOTE_EVERY_S:
                self._noted = now
                log.info("consumer %s: no partitions assigned yet; waiting", name)
            return False
        if self._since is None:
            self._since = now
        if now - self._since < self._max_idle_s:
            return False
        lag = self._runtime.lag()
        if lag == 0:
            self.drained = self._runtime.assigned
            log.info("consumer %s: %d partitions read to their end", name, len(self.drained))
            return True
        behind = "its lag is unknown" if lag is None else f"{lag:,} messages are still unread"
        log.info(
            "consumer %s: nothing arrived for %g s but %s; going on", name, self._max_idle_s, behind
        )
        self._since = now
        return False
