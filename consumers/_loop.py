"""How a consumer's ``run`` goes on: turn the pipeline until told to stop or idle, wait
and retry after a failure that a retry can mend, and sum what the batches did."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from agent_blackbox.consumers._batch import BatchOutcome
from agent_blackbox.consumers._errors import DeadLetterFailed, MemberFenced, ViewStoreUnavailable
from agent_blackbox.consumers._idle import IdleClock

# These are the runtime's log lines: they keep its logger's name.
log = logging.getLogger("agent_blackbox.consumers._runtime")

_RETRYABLE = (ViewStoreUnavailable, DeadLetterFailed, MemberFenced)
_MAX_BACKOFF_S = 30.0


class Turns(Protocol):
    """What the loop asks of a pipeline (see :class:`._pipeline.Pipeline`)."""

    @property
    def holding(self) -> bool:
        """Whether a decoded batch waits for its commit."""
        ...

    def turn(self, timeout: float) -> BatchOutcome | None:
        """Read the next batch while the last one commits; the committed outcome."""
        ...

    def flush(self) -> BatchOutcome | None:
        """Commit the batch still waiting, if any."""
        ...


class ConsumeLoop:
    """Runs a pipeline's turns until ``stop`` is set or ``idle`` says it is finished.

    A lost database, an unacknowledged dead letter or a fenced static membership (the
    member joins again) is retried with a backoff that doubles from 0.4 s to at most
    30 s; anything else ends the loop.

    Args:
        consumer: the consumer's name, for the log.
        stop: ends the loop once set (the batch waiting is still committed).
        idle: says when an idle consumer may stop.
        between: the consumer's periodic work, after every successful turn.
        on_batch: called with each committed batch's outcome.
    """

    def __init__(
        self,
        consumer: str,
        *,
        stop: threading.Event,
        idle: IdleClock,
        between: Callable[[], None],
        on_batch: Callable[[BatchOutcome], None] | None,
    ) -> None:
        self._consumer = consumer
        self._stop = stop
        self._idle = idle
        self._between = between
        self._on_batch = on_batch
        self._failures = 0
        self.total = BatchOutcome()
        """The sum of every committed batch's outcome."""
        self.idled = False
        """Whether the loop ended because the consumer was idle."""

    def drive(self, pipeline: Turns, poll_timeout_s: float) -> BatchOutcome:
        """Turn ``pipeline`` until stopped or idle, then flush it; the total outcome.

        Raises:
            KafkaUnavailable, ViewsNotMigrated, ProjectionFailed: not retryable here.
        """
        while not self._stop.is_set():
            outcome = self._turn(pipeline, poll_timeout_s)
            if outcome is not None:
                self._committed(outcome)
            elif not pipeline.holding and self._idle.finished():
                self.idled = True
                break
        try:
            if (outcome := pipeline.flush()) is not None:
                self._committed(outcome)
        except _RETRYABLE as exc:
            log.warning("consumer %s: the last batch was not committed: %s", self._consumer, exc)
        return self.total

    def _turn(self, pipeline: Turns, poll_timeout_s: float) -> BatchOutcome | None:
        try:
            outcome = pipeline.turn(poll_timeout_s)
            self._between()
        except _RETRYABLE as exc:
            self._failures += 1
            delay = min(_MAX_BACKOFF_S, 0.2 * 2**self._failures)
            log.warning("consumer %s: %s; retrying in %.1f s", self._consumer, exc, delay)
            self._stop.wait(delay)
            return None
        self._failures = 0
        return outcome

    def _committed(self, outcome: BatchOutcome) -> None:
        self.total += outcome
        self._idle.reset()
        if self._on_batch is not None:
            self._on_batch(outcome)
