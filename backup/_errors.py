"""What can go wrong with a backup, one class per condition a caller acts on."""

from __future__ import annotations

from agent_blackbox.schemas import BlackboxError


def first_line(exc: BaseException) -> str:
    """The driver's own message of ``exc``, first line only (no SQL, no links)."""
    cause = getattr(exc, "orig", None)
    lines = str(cause if cause is not None else exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class BackupError(BlackboxError):
    """The root of the backup's errors."""


class BackupCorrupt(BackupError):
    """A backup object is not what its manifest says (unreadable, wrong digest, a broken
    manifest chain, a signature that does not verify); the message names the object."""


class BackupBusy(BackupError):
    """Another backup process is writing to the same store."""


class BackupDiverged(BackupError):
    """The database's record of what was backed up and the store's manifests disagree
    (the store was emptied, rolled back, or is another store)."""


class EventsLost(BackupError):
    """Events the backup had not read yet were removed by the topic's retention."""
