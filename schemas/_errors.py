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
