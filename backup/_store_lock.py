"""One backup writer per store: a Postgres advisory lock held for as long as it writes.

The lock belongs to a database session, so it ends with the session: a primary that
fails over to its standby takes it along. The writer checks the session before each cut
(:meth:`StoreLock.hold`) and takes the lock again on the database that now answers.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.backup._errors import BackupBusy, BackupError, first_line


class StoreLock:
    """The session-level advisory lock that keeps a second writer off a store.

    Args:
        engine: the production database, which holds the lock.
        name: what the lock is taken on (the store's consumer group).
        store: the store's description, for the error a second writer gets.
    """

    def __init__(self, engine: Engine, *, name: str, store: str) -> None:
        self._engine = engine
        self._name = name
        self._store = store
        self._session: Connection | None = None

    def acquire(self) -> None:
        """Take the lock on a session of its own, kept until :meth:`release`.

        Raises:
            BackupError: the database is unreachable.
            BackupBusy: another writer holds the lock.
        """
        try:
            self._session = self._engine.connect()
            locked = self._session.execute(
                text("SELECT pg_try_advisory_lock(hashtextextended(:name, 0))"),
                {"name": self._name},
            ).scalar_one()
            self._session.commit()
        except SQLAlchemyError as exc:
            self.release()
            raise BackupError(
                f"cannot reach the database to lock the backup store: {first_line(exc)}; check "
                "BLACKBOX_DATABASE_URL"
            ) from exc
        if not locked:
            self.release()  # a session without the lock must not pass for one with it
            raise BackupBusy(
                f"another backup writer is writing to {self._store}; stop it "
                "first (one writer per store)"
            )

    def hold(self) -> None:
        """Make sure the lock is still held, taking it again on a new session when the
        one that held it is gone (the database restarted or failed over).

        Raises:
            BackupError: the database is unreachable.
            BackupBusy: another writer took the lock while this one's session was gone.
        """
        if self._session is not None and self._alive(self._session):
            return
        self.release()
        self.acquire()

    @staticmethod
    def _alive(session: Connection) -> bool:
        try:
            session.execute(text("SELECT 1")).scalar_one()
            session.rollback()  # ends the read; a session's advisory lock outlives it
        except SQLAlchemyError:
            return False
        return True

    def release(self) -> None:
        """Give the lock up (nothing happens when it is not held)."""
        if self._session is None:
            return
        # The lock is the session's: end the session itself rather than hand a
        # connection that still holds it back to the pool.
        self._session.invalidate()
        self._session.close()
        self._session = None
