"""The outbox lane: the relay's reads and deletes of outbox rows, off its producing thread.

The relay produces on its own thread while the database works: it hands each read and
each delete to the lane and collects the result later (see ``_relay.Relay._next_rows``).
Reads and deletes run on two threads, each with a database session of its own, in
autocommit with the lane's settings.

Order. A read counts, in its own snapshot, the rows at or below the last one produced,
and the relay compares that with what it has in flight, counting a delete handed over
before the read as done and one handed over after it as not begun. So a read waits until
every delete handed over before it finished, and a delete waits until every read handed
over before it has run its statement (its snapshot taken, its rows received). Within
these rules a delete runs while the read before it is still turning its rows into Python
values, and the next batch's read waits only for the delete's statement: the database
deletes one batch while the relay converts the next.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, TextClause
from sqlalchemy.exc import DBAPIError, SQLAlchemyError


class OutboxLane:
    """Reads and deletes of outbox rows in the order they are handed over (see above).

    Args:
        engine: the write side's database.
        name: names the lane's threads (the relay's owner id).
        setup: run once on each new session, with ``setup_params``.

    Only one thread may hand work over (the relay's loop); results and errors come
    back through the futures. A session that failed is dropped and the next statement
    opens a new one.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        setup: TextClause,
        setup_params: Mapping[str, Any],
    ) -> None:
        self._engine = engine
        self._setup, self._setup_params = setup, dict(setup_params)
        self._readers = ThreadPoolExecutor(1, thread_name_prefix=f"outbox {name}")
        self._deleters = ThreadPoolExecutor(1, thread_name_prefix=f"outbox deletes {name}")
        self._read_conn: Connection | None = None
        self._delete_conn: Connection | None = None
        self._deletes: list[Future[None]] = []
        """Deletes handed over and perhaps not finished."""
        self._reads: list[threading.Event] = []
        """One per read handed over whose statement perhaps has not run."""

    def read(self, statement: str, params: Mapping[str, Any]) -> Future[list[Any]]:
        """Run ``statement`` (on the driver's cursor, binary results) once the deletes
        handed over so far finished; the future holds its rows."""
        self._deletes = [d for d in self._deletes if not d.done()]
        ran = threading.Event()
        self._reads = [r for r in self._reads if not r.is_set()] + [ran]
        future = self._readers.submit(self._read, statement, params, list(self._deletes), ran)
        # A read that never runs (shut down first) lets the deletes after it go.
        future.add_done_callback(lambda _: ran.set())
        return future

    def delete(self, statement: str, params: Mapping[str, Any]) -> Future[None]:
        """Run ``statement`` once the reads handed over so far have run theirs."""
        self._reads = [r for r in self._reads if not r.is_set()]
        future = self._deleters.submit(self._delete, statement, params, list(self._reads))
        self._deletes.append(future)
        return future

    def close(self) -> None:
        """Finish what was handed over, then close both sessions."""
        self._readers.shutdown(wait=True)
        self._deleters.shutdown(wait=True)
        _drop(self._read_conn)
        _drop(self._delete_conn)
        self._read_conn = self._delete_conn = None

    def _read(
        self,
        statement: str,
        params: Mapping[str, Any],
        deletes: Sequence[Future[None]],
        ran: threading.Event,
    ) -> list[Any]:
        try:
            # A delete that failed left its rows: the count shows them, which is safe.
            wait(deletes)
            if self._read_conn is None:
                self._read_conn = self._session()
            try:
                with _cursor(self._read_conn) as cursor:
                    cursor.execute(statement, params, binary=True)
                    ran.set()  # the snapshot is taken and the rows are here
                    return cursor.fetchall()
            except psycopg.Error as exc:
                _drop(self._read_conn)
                self._read_conn = None
                raise DBAPIError.instance(statement, params, exc, psycopg.Error) from exc
        finally:
            ran.set()

    def _delete(
        self, statement: str, params: Mapping[str, Any], reads: Sequence[threading.Event]
    ) -> None:
        for ran in reads:
            ran.wait()
        if self._delete_conn is None:
            self._delete_conn = self._session()
        try:
            with _cursor(self._delete_conn) as cursor:
                cursor.execute(statement, params)
        except psycopg.Error as exc:
            _drop(self._delete_conn)
            self._delete_conn = None
            raise DBAPIError.instance(statement, params, exc, psycopg.Error) from exc

    def _session(self) -> Connection:
        """A connection in autocommit with the lane's settings. It never goes back to the
        pool (its settings would go with it)."""
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            conn.execute(self._setup, self._setup_params)
        except SQLAlchemyError:
            _drop(conn)
            raise
        return conn


def _cursor(conn: Connection) -> psycopg.Cursor[Any]:
    """The driver's own cursor: statements the lane runs in a steady loop skip
    SQLAlchemy's per-call work, and psycopg prepares them after a few runs."""
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    return driver.cursor()


def _drop(conn: Connection | None) -> None:
    if conn is not None:
        conn.invalidate()
        conn.close()
