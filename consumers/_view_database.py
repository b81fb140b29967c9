"""The consumer runtime's database edge: one transaction per batch, driver errors
translated into the conditions a consumer acts on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from agent_blackbox.consumers._errors import (
    ProjectionFailed,
    ViewsNotMigrated,
    ViewStoreUnavailable,
)
from agent_blackbox.schemas import Settings
from agent_blackbox.wiring import SERVICE_POOL

_MISSING_RELATION = {"42P01", "3F000", "42703"}  # undefined table, schema, column


class ViewDatabase:
    """The view database as one consumer uses it.

    Args:
        settings: the database's URL, used when no ``engine`` is given.
        engine: the database the views live in; without one, the service pool makes
            one that :meth:`close` disposes of.
        consumer: the consumer's name, for the error messages.
    """

    def __init__(self, settings: Settings, *, engine: Engine | None, consumer: str) -> None:
        self._engine = engine or SERVICE_POOL.engine(settings.database_url)
        self._owned = engine is None
        self._consumer = consumer

    @property
    def engine(self) -> Engine:
        """The database the views live in (for a projection that reads beside them)."""
        return self._engine

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a transaction that commits when the block ends.

        Raises:
            ViewStoreUnavailable: the database is unreachable or dropped the connection.
            ViewsNotMigrated: a view table, schema or column is missing.
            ProjectionFailed: the database refused the batch for another reason.
        """
        try:
            with self._engine.begin() as conn:
                yield conn
        except (OperationalError, InterfaceError) as exc:
            raise ViewStoreUnavailable(
                f"the view database failed under consumer {self._consumer!r}: "
                f"{exc.orig or exc}; nothing was committed, the consumer rewinds to its "
                "stored offsets and retries"
            ) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise ViewStoreUnavailable(
                    f"view database connection dropped: {exc.orig}; retrying"
                ) from exc
            if getattr(exc.orig, "sqlstate", None) in _MISSING_RELATION:
                raise ViewsNotMigrated(str(exc.orig).splitlines()[0]) from exc
            raise ProjectionFailed(self._refused(exc)) from exc
        except SQLAlchemyError as exc:
            raise ProjectionFailed(self._refused(exc)) from exc

    def close(self) -> None:
        """Release the engine's connections if the consumer made it."""
        if self._owned:
            self._engine.dispose()

    def _refused(self, exc: SQLAlchemyError) -> str:
        return (
            f"the view database refused a batch of consumer {self._consumer!r}: {exc}; "
            "nothing was committed. Check the projection and the view schema version"
        )
