"""The outbox lane: the relay's reads and deletes of outbox rows, off its producing thread.

The relay produces on its own thread while the database works: its reader
(``_reader.OutboxReader``) hands each read and each delete to the lane and collects the
result later.
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
        read_setup: run once on each new reading session, with ``setup_params``.
        delete_setup: likewise on each new deleting session.

    Only one thread may hand work over (the relay's loop); results and errors come
    back through the futures. A session that failed is dropped and the next statement
    opens a new one.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        read_setup: TextClause,
        delete_setup: TextClause,
        setup_params: Mapping[str, Any],
    ) -> None:
        self._readers = ThreadPoolExecutor(1, thread_name_prefix=f"outbox {name}")
        self._deleters = ThreadPoolExecutor(1, thread_name_prefix=f"outbox deletes {name}")
        self._read_session = _Session(engine, read_setup, setup_params)
        self._delete_session = _Session(engine, delete_setup, setup_params)
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
        self._read_session.close()
        self._delete_session.close()

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
            # ``ran`` once the snapshot is taken and the rows are here.
            return self._read_session.run(statement, params, binary=True, ran=ran)
        finally:
            ran.set()

    def _delete(
        self, statement: str, params: Mapping[str, Any], reads: Sequence[threading.Event]
    ) -> None:
        for ran in reads:
            ran.wait()
        self._delete_session.run(statement, params)


class _Session:
    """One of the lane's database sessions: a connection in autocommit with the lane's
    settings, opened when first needed and again after an error. It never goes back to
    the pool (its settings would go with it)."""

    def __init__(self, engine: Engine, setup: TextClause, setup_params: Mapping[str, Any]) -> None:
        self._engine = engine
        self._setup, self._setup_params = setup, dict(setup_params)
        self._conn: Connection | None = None

    def run(
        self,
        statement: str,
        params: Mapping[str, Any],
        *,
        binary: bool = False,
        ran: threading.Event | None = None,
    ) -> list[Any]:
        """Run ``statement`` on the driver's own cursor (a statement in a steady loop
        skips SQLAlchemy's per-call work, and psycopg prepares it after a few runs); its
        rows, if it gives any. A driver error drops the session and is raised as
        SQLAlchemy raises it."""
        conn = self._connect()
        driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        try:
            with driver.cursor() as cursor:
                cursor.execute(statement, params, binary=binary)
                if ran is not None:
                    ran.set()
                return cursor.fetchall() if cursor.description else []
        except psycopg.Error as exc:
            self.close()
            raise DBAPIError.instance(statement, params, exc, psycopg.Error) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.invalidate()
            self._conn.close()
            self._conn = None

    def _connect(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                conn.execute(self._setup, self._setup_params)
            except SQLAlchemyError:
                conn.invalidate()
                conn.close()
                raise
            self._conn = conn
        return self._conn
