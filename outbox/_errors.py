"""Errors of the write side."""

from __future__ import annotations

from agent_blackbox.schemas import BlackboxError, NotSerialisable

__all__ = [
    "BlackboxError",
    "ConcurrentRunWriter",
    "DatabaseUnavailable",
    "EffectRejected",
    "EventsNotRecorded",
    "MaybeRecorded",
    "NotSerialisable",
    "PayloadTooLarge",
    "RecordedError",
    "RedactionConfigError",
    "RunNotActive",
    "WriterRefused",
]


class DatabaseUnavailable(BlackboxError):
    """Postgres cannot be reached or refused a statement.

    Raised by an append, ``maybe_recorded`` says what became of the event: False, nothing
    was recorded (recording the call again records it once); True (the subclass
    :class:`MaybeRecorded`), it may have been.
    """

    maybe_recorded = False
    run_id: str | None = None
    """The run of the event an append could not write (None: not an append)."""
    sequence: int | None = None
    """That event's sequence in the run, as last tried."""
    event_id: str | None = None
    """That event's id (kept across the attempts)."""


class MaybeRecorded(DatabaseUnavailable):
    """The connection failed while the event was being committed, and no later attempt
    reached the database to find out: the event may be in the run, or not.

    Do not record the call again (a tool would run twice). Keep the run: its next append
    continues after the event if it committed, in its place if not. An effect whose intent
    this is was not performed; once the database answers, ``recorder.unresolved_effects()``
    lists the intent if it committed, to resolve before trying the effect again.
    """

    maybe_recorded = True


class PayloadTooLarge(BlackboxError, ValueError):
    """A body is larger than the configured maximum."""

    def __init__(self, event_type: str, size: int, limit: int) -> None:
        self.event_type = event_type
        self.size = size
        self.limit = limit
        super().__init__(
            f"{event_type} body is {size} bytes, over the limit of {limit}; record a "
            "reference or a summary instead, or raise BLACKBOX_MAX_BLOB_BYTES"
        )


class RedactionConfigError(BlackboxError, ValueError):
    """A redaction configuration is unreadable, names an unknown detector or a bad path."""


class RunNotActive(BlackboxError):
    """A boundary was crossed on a run that is finished or was never started."""


class WriterRefused(BlackboxError):
    """The database refused this writer: the run is not one it started (no matching
    writer credential), its tenant is not granted to the database role, or a sealed run
    was sent a plaintext body. Nothing was recorded."""


class ConcurrentRunWriter(BlackboxError):
    """Another writer advanced the same run; each run must have one writer at a time."""


class EventsNotRecorded(BlackboxError):
    """In group commit mode, buffered events of a run could not be written.

    ``count`` events are not recorded (or, when ``cause`` says a commit was cut, may have
    been); they stay buffered in this process, and the run's next boundary or
    ``run.flush()`` writes them, or finds them committed. They are lost if the process
    ends first. ``cause`` is the error of the flush.
    """

    def __init__(self, run_id: str, count: int, cause: BlackboxError) -> None:
        self.run_id = run_id
        self.count = count
        self.cause = cause
        self.maybe_recorded = isinstance(cause, MaybeRecorded)
        """Some of them may have been committed (the flush's commit was cut)."""
        super().__init__(
            f"group commit: {count} buffered event(s) of run {run_id} could not be "
            f"written: {cause}. They stay buffered in this process: the run's next boundary or "
            "run.flush() tries again (and recognises events that did commit); they are "
            "lost if the process ends first"
        )


class EffectRejected(BlackboxError):
    """Raised by an effect's ``perform`` to say the external system refused it for sure.

    Any other exception leaves the receipt ``unknown``: the call may have happened.
    """

    def __init__(self, message: str, *, external_id: str | None = None) -> None:
        self.external_id = external_id
        super().__init__(message)


class RecordedError(BlackboxError):
    """In replay, the exception a boundary raised when it was recorded, when its own class
    cannot be raised again (not imported in this process, or recorded without its
    arguments). Replay raises a subclass named like the recorded class, so the type name
    shows in tracebacks; ``except RecordedError`` catches them all.

    ``type_name``, ``module`` and ``message`` are what was recorded.
    """

    def __init__(self, type_name: str, message: str, *, module: str | None = None) -> None:
        self.type_name = type_name
        self.module = module
        self.message = message
        self.recorded_error: dict[str, str] = {"type": type_name, "message": message}
        if module is not None:
            self.recorded_error["module"] = module
        super().__init__(f"{type_name}: {message}")
