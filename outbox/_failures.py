"""What a failed statement or transaction of the event log means: a refusal of the write
functions (the writer's error), a transient failure (try again, after a pause), or the
end of the attempts (the agent is told whether its event may have been recorded)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy.exc import DataError, DBAPIError, SQLAlchemyError

from agent_blackbox.outbox._errors import (
    ConcurrentRunWriter,
    DatabaseUnavailable,
    MaybeRecorded,
    NotSerialisable,
    RunNotActive,
    WriterRefused,
)

if TYPE_CHECKING:
    from agent_blackbox.outbox._writer import PreparedEvent

TRANSIENT_RETRIES = 3
# serialization_failure, deadlock_detected, admin/crash shutdown, cannot_connect_now
_TRANSIENT_STATES = {"40001", "40P01", "57P01", "57P02", "57P03"}

# admin_shutdown, crash_shutdown: the server ended the session, whatever it was doing
# (``pg_ctl stop -m immediate`` ends a session whose commit may be on disk already).
_ENDED_STATES = {"57P01", "57P02"}

_NOT_ALLOWED = "42501"
_NOT_RUNNING = "55000"
_IN_USE = "55006"


def refusal(
    exc: DBAPIError,
) -> WriterRefused | RunNotActive | ConcurrentRunWriter | NotSerialisable | None:
    """The writer's error for a refusal by the write functions, or of a value Postgres
    cannot store (None: not a refusal)."""
    code = getattr(exc.orig, "sqlstate", None)
    if isinstance(exc, DataError) and (code is None or code.startswith("22")):
        # The driver refused a parameter before sending it (no SQLSTATE), or the server
        # refused a value: nothing was written, and trying again changes nothing.
        return NotSerialisable(
            "the event's ids and names",
            f"Postgres cannot store one of them ({str(exc.orig).splitlines()[0]}); "
            "nothing was recorded",
            "Remove what it cannot hold (a NUL character) from the run's agent_id, "
            "tenant_id, run_id, subject_ids or code_version, the state's name, or the "
            "effect's name or idempotency key.",
        )
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


def retry_delay(
    exc: DBAPIError, attempt: int, *, ambiguous: bool = False, connecting: bool = False
) -> float:
    """How long to wait before the next attempt of a transaction that failed with
    ``exc`` (``ambiguous``: an attempt so far failed while committing; ``connecting``:
    this one failed to connect).

    A connection the server did not take (refused, cut, starting up) is worth another
    attempt: that is how an attempt after an ambiguous commit reaches a database that is
    back, and finds out what became of the event.

    Raises:
        DatabaseUnavailable: the failure is not transient, or that was the last attempt
            (:class:`MaybeRecorded` when ``ambiguous``).
    """
    code = getattr(exc.orig, "sqlstate", None)
    unreached = connecting and (code is None or code.startswith("08"))
    transient = unreached or exc.connection_invalidated or code in _TRANSIENT_STATES
    if not transient or attempt == TRANSIENT_RETRIES - 1:
        raise unavailable(exc, ambiguous=ambiguous) from exc
    return 0.05 * 2.0**attempt


def cut_off(exc: DBAPIError) -> bool:
    """Whether ``exc`` ended the session rather than answered the statement: a statement
    that commits by itself (autocommit) may then have committed, as a cut COMMIT may."""
    code = getattr(exc.orig, "sqlstate", None)
    return bool(
        exc.connection_invalidated or code is None or code in _ENDED_STATES or code.startswith("08")
    )


def unavailable(exc: SQLAlchemyError, *, ambiguous: bool = False) -> DatabaseUnavailable:
    """What the agent is told when its event could not be written: that nothing was
    recorded, or, when a commit was under way as the connection failed at any attempt
    and no later attempt could find out, that it may have been (:class:`MaybeRecorded`)."""
    failure = f"the outbox write failed: {exc.__class__.__name__}: {str(exc).splitlines()[0]}"
    remedy = (
        "Check that Postgres is reachable (BLACKBOX_DATABASE_URL) and migrated (blackbox migrate)"
    )
    if ambiguous:
        return MaybeRecorded(
            f"{failure}; the connection failed while the event was being committed and the "
            "database did not answer again, so it may have been recorded. Do not record the "
            "call again (a tool would run twice): keep the run, whose next append continues "
            f"after the event if it committed. {remedy}"
        )
    return DatabaseUnavailable(f"{failure}; nothing was recorded for this event. {remedy}")


_OPEN_INTENT = (
    "The effect was not performed. If its intent committed, recorder.unresolved_effects() "
    "lists it once the database answers: resolve it (run.resolve_effect) before trying "
    "the effect again"
)


@contextmanager
def naming(event: Callable[[], PreparedEvent]) -> Iterator[None]:
    """Name the event being appended (``event()``: as last tried) on a
    :class:`DatabaseUnavailable` raised inside, and say what an open intent means."""
    try:
        yield
    except DatabaseUnavailable as exc:
        envelope = event().envelope
        exc.run_id, exc.sequence, exc.event_id = (
            envelope.run_id,
            envelope.sequence,
            envelope.event_id,
        )
        if exc.maybe_recorded and envelope.event_type == "effect.intent":
            exc.add_note(_OPEN_INTENT)
        raise
