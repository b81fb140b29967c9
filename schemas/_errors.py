"""The exceptions every part of agent-blackbox raises.

One root, :class:`BlackboxError`, and one class per condition a caller can act on.
Each message says what was wrong and what to do about it.
"""

from __future__ import annotations


class BlackboxError(Exception):
    """Root of every error agent-blackbox raises on purpose."""


class KeyUnavailable(BlackboxError):
    """A sealed payload's key cannot be had: missing, destroyed, not unwrappable with
    the key-encryption keys at hand, or withheld from this principal. The bytes may be
    intact; nothing can be said about them without the key."""


class NotSerialisable(BlackboxError, TypeError):
    """A value handed to the recorder cannot be written as canonical JSON."""

    def __init__(self, path: str, reason: str, advice: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.advice = advice
        super().__init__(
            f"{path}: {reason}. "
            + (
                advice
                or "Convert it to JSON types (str, int, float, bool, None, list, dict with "
                "str keys) before it crosses a recorded boundary."
            )
        )


class UnknownSchemaVersion(BlackboxError):
    """No reader path exists for this event type and body version."""

    def __init__(
        self,
        event_type: str,
        version: int,
        known: tuple[int, ...],
        *,
        reason: str | None = None,
    ) -> None:
        self.event_type = event_type
        self.version = version
        self.known = known
        self.reason = reason
        hint = (
            f"known versions: {', '.join(map(str, known))}"
            if known
            else "this event type is not known at all"
        )
        if reason is None:
            message = (
                f"no schema for event type {event_type!r} version {version} ({hint}); "
                "upgrade agent-blackbox to a release that knows it"
            )
        else:
            message = (
                f"no reader path for event type {event_type!r} version {version} ({hint}): {reason}"
            )
        super().__init__(message)


class UndecodableMessage(BlackboxError):
    """Bytes that should hold an envelope do not decode as one."""


class BodyEncodingError(BlackboxError, ValueError):
    """A body does not fit the Avro schema of its event type and version."""

    def __init__(self, event_type: str, version: int, reason: str) -> None:
        self.event_type = event_type
        self.version = version
        super().__init__(f"{event_type} v{version} body does not fit its schema: {reason}")


class MigrationFailed(BlackboxError):
    """A migrator raised on a body it should have turned into the next version."""

    def __init__(self, event_type: str, version: int, reason: str) -> None:
        self.event_type = event_type
        self.version = version
        super().__init__(
            f"{event_type} v{version} body does not migrate to v{version + 1}: {reason}; "
            "the stored body is damaged or the migrator has a bug (originals are never "
            "rewritten, so fixing the migrator fixes every read)"
        )


INSUFFICIENT_PRIVILEGE = "42501"
"""The SQLSTATE Postgres gives every "permission denied" (and the write functions'
refusals)."""


class PermissionRefused(BlackboxError):
    """The database refused the session user a privilege the work needs: the process
    connects as the wrong role, or its login lacks a grant. Retrying cannot help."""


def permission_refused(exc: BaseException) -> str | None:
    """The database's refusal line when ``exc`` or anything it was raised from (its
    ``__cause__``, ``__context__``, or a driver error it wraps as ``orig``) is a
    permission error (SQLSTATE 42501, or a message saying "permission denied"); None
    otherwise.

    Read from attributes only, so the leaf package needs no database driver.
    """
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    ours: str | None = None
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        code = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if code == INSUFFICIENT_PRIVILEGE:
            return _first_line(current)  # the database's own words, wherever they are
        if isinstance(current, PermissionRefused) and ours is None:
            ours = _first_line(current)
        pending.extend(
            e
            for e in (getattr(current, "orig", None), current.__cause__, current.__context__)
            if isinstance(e, BaseException)
        )
    return ours


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def driver_cause(exc: BaseException) -> str:
    """The first line of what the database driver said of ``exc`` (SQLAlchemy's wrapper,
    which it is read through as ``orig``, goes on with the SQL and a link, and prints
    escaped on one line): its type's name when it said nothing."""
    return _first_line(getattr(exc, "orig", None) or exc)


def unreachable_database(cause: str, where: str | None = None) -> str:
    """What to say of a database that could not be reached: the driver's ``cause`` and
    what to check (``where``: its URL, without the password)."""
    at = "" if where is None else f" at {where}"
    return (
        f"cannot reach the database{at} ({cause}); is it running (blackbox stack status, "
        "locally), and is BLACKBOX_DATABASE_URL right?"
    )
