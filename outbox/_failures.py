"""What a failed statement or transaction of the event log means: a refusal of the write
functions (the writer's error), a transient failure (try again, after a pause), or the
end of the attempts (the agent is told whether its event may have been recorded)."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from agent_blackbox.outbox._errors import (
    ConcurrentRunWriter,
    DatabaseUnavailable,
    RunNotActive,
    WriterRefused,
)

TRANSIENT_RETRIES = 3
# serialization_failure, deadlock_detected, admin/crash shutdown, cannot_connect_now
_TRANSIENT_STATES = {"40001", "40P01", "57P01", "57P02", "57P03"}

_NOT_ALLOWED = "42501"
_NOT_RUNNING = "55000"
_IN_USE = "55006"


def refusal(exc: DBAPIError) -> WriterRefused | RunNotActive | ConcurrentRunWriter | None:
    """The writer's error for a refusal by the write functions (None: not a refusal)."""
    code = getattr(exc.orig, "sqlstate", None)
    if code not in (_NOT_ALLOWED, _NOT_RUNNING, _IN_USE):
        return None
    diagnostic = getattr(exc.orig, "diag", None)
    message = getattr(diagnostic, "message_primary", None) or str(exc.orig).splitlines()[0]
    if code == _NOT_RUNNING:
        return RunNotActive(message)
    if code == _IN_USE:
        return ConcurrentRunWriter(message)
    return WriterRefused(
        f"{message}; nothing was recorded. A recorder appends only to runs it started "
        "(resume a crashed run with Recorder.resume), for tenants granted to its database "
        "role (blackbox tenants grant ROLE TENANT), sealed when the run has a data key"
    )


def retry_delay(exc: DBAPIError, attempt: int, *, ambiguous: bool = False) -> float:
    """How long to wait before the next attempt of a transaction that failed with
    ``exc`` (``ambiguous``: an attempt so far failed while committing).

    Raises:
        DatabaseUnavailable: the failure is not transient, or that was the last attempt.
    """
    code = getattr(exc.orig, "sqlstate", None)
    transient = exc.connection_invalidated or code in _TRANSIENT_STATES
    if not transient or attempt == TRANSIENT_RETRIES - 1:
        raise unavailable(exc, ambiguous=ambiguous) from exc
    return 0.05 * 2.0**attempt


def unavailable(exc: SQLAlchemyError, *, ambiguous: bool = False) -> DatabaseUnavailable:
    """What the agent is told when its event could not be written: that nothing was
    recorded, or, when a commit was under way as the connection failed, that it may
    have been."""
    outcome = (
        "the connection failed while the event was being committed, so it may have been "
        "recorded; the run's next append will tell (it recognises its own event)"
        if ambiguous
        else "nothing was recorded for this event"
    )
    return DatabaseUnavailable(
        f"the outbox write failed: {exc.__class__.__name__}: {str(exc).splitlines()[0]}; "
        f"{outcome}. Check that Postgres is reachable (BLACKBOX_DATABASE_URL) and migrated "
        "(blackbox migrate)"
    )
