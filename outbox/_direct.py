"""The sync event log's own transactions, run on the pool's DB-API connection.

An agent pays for its recorder in CPU on every boundary, and with one transaction per
event, the layers between a plan and the driver were a third of it: SQLAlchemy's
``Connection``, its execution context and result for every statement, its transaction
object for BEGIN and COMMIT. A transaction the log owns (not one an agent joined) needs
none of what they add, so here the same plans run on the DB-API cursor of a pooled
connection: each statement is compiled once for the engine's dialect, executed with its
parameters as they are, and its rows handed back as a small result. What reaches the
server is what SQLAlchemy would have sent (the same SQL and parameters, BEGIN, COMMIT;
the driver prepares a statement it sees again, as before), and a driver error is
translated as SQLAlchemy translates it, so the retry policy and what the agent is told
(``_failures.py``) are the same on both paths.

An engine someone listens to at the statement level (``before_cursor_execute``: tracing,
statement counts) keeps every statement on SQLAlchemy's path, where they see it.

Parameters named as binary (a group flush's arrays) go to psycopg in binary format
(``%(name)b``): SQLAlchemy's ``%(name)s`` lets psycopg choose, and for a list it chooses
text, where each envelope of a ``bytea[]`` is escaped and each element of every array
searched for characters to quote, in Python: 7.9 ms of the writer's CPU for a statement
of 256 events, against 0.8 ms in binary. Only with psycopg (3), which reads that
placeholder; the values and what the server receives are the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Engine, TextClause
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from agent_blackbox.outbox._failures import (
    TRANSIENT_RETRIES,
    cut_off,
    refusal,
    retry_delay,
    unavailable,
)
from agent_blackbox.outbox._stepper import Stepper

if TYPE_CHECKING:
    from sqlalchemy.pool import PoolProxiedConnection

    from agent_blackbox.outbox._postgres import Plan

T = TypeVar("T")


class Rows:
    """What a statement gave, read at once: the parts of a SQLAlchemy result the plans
    use (``scalar_one``, ``first``, ``rowcount``)."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, cursor: Any, error: type[Exception]) -> None:
        self.rowcount: int = cursor.rowcount
        try:
            # Every statement of an append returns rows; asking the cursor for its
            # description first would build column objects nobody reads.
            self._rows: list[Any] = cursor.fetchall()
        except error:  # a statement without rows (SAVEPOINT)
            self._rows = []

    def scalar_one(self) -> Any:
        if len(self._rows) != 1:
            raise ValueError(f"expected one row, the statement gave {len(self._rows)}")
        return self._rows[0][0]

    def first(self) -> Any:
        return self._rows[0] if self._rows else None


@dataclass(frozen=True, slots=True)
class _Tried:
    """An attempt that failed and may be tried again after ``delay`` seconds."""

    delay: float


def _lend_back(connection: PoolProxiedConnection) -> None:
    """Out of autocommit again, as the pool lends its connections."""
    driver: Any = connection.dbapi_connection
    driver.autocommit = False


class DirectTransactions:
    """Runs plans, each in a transaction of its own, on DB-API connections of
    ``engine``'s pool, with the retries of the log's own transactions."""

    def __init__(
        self, engine: Engine, *, binary: Mapping[TextClause, Collection[str]] | None = None
    ) -> None:
        self._engine = engine
        self._dialect = engine.dialect
        self._error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._sql: dict[int, tuple[TextClause, str]] = {}
        """Compiled SQL by statement (kept with it, so that its id stays its own)."""
        self._binary = {
            id(clause): (clause, tuple(names))
            for clause, names in (binary or {}).items()
            if engine.dialect.driver == "psycopg"  # the one driver that reads %(name)b
        }

    @classmethod
    def of(
        cls, engine: Engine, *, binary: Mapping[TextClause, Collection[str]] | None = None
    ) -> DirectTransactions | None:
        """The direct path for ``engine``, or None where only SQLAlchemy's will do (an
        async driver under a sync facade, or a paramstyle other than pyformat).
        ``binary`` names, by statement, the parameters sent in binary format."""
        dialect = engine.dialect
        if dialect.is_async or dialect.paramstyle != "pyformat":
            return None
        return cls(engine, binary=binary)

    @property
    def watched(self) -> bool:
        """Someone listens to the engine's statements: they go through SQLAlchemy."""
        dispatch = self._engine.dispatch
        return bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute)

    def transact(self, plan: Callable[[], Plan[T]], *, autocommit: bool = False) -> T:
        """Run a fresh ``plan()`` in a new transaction until one commits, retrying a lost
        connection or a serialisation failure (see :func:`retry_delay`).

        With ``autocommit``, each statement of the plan commits on its own: for a plan
        whose writes are one statement that holds together by itself (an append through
        ``append_event``: guard, run row, outbox row and effect row in one function
        call), that spares BEGIN and COMMIT, two of its three round trips. A connection
        lost during a statement then leaves its outcome open, as a lost COMMIT does, and
        the retry finds out (the plan recognises its own event at the run's head).
        """
        ambiguous = False
        try:
            for attempt in range(TRANSIENT_RETRIES):
                done, ambiguous = self._attempt(plan, attempt, ambiguous, autocommit=autocommit)
                if isinstance(done, _Tried):
                    time.sleep(done.delay)  # back off before a fresh attempt
                    continue
                return done
        except SQLAlchemyError as exc:  # (the pool's own errors: no connection to lend)
            raise unavailable(exc, ambiguous=ambiguous) from exc
        raise AssertionError("unreachable")

    def _attempt(
        self, plan: Callable[[], Plan[T]], attempt: int, ambiguous: bool, *, autocommit: bool
    ) -> tuple[T | _Tried, bool]:
        """One attempt: the plan's result, or how long to wait before the next; with
        whether any attempt so far may have committed.

        Raises:
            DatabaseUnavailable: that was the last attempt, or the failure is not transient.
        """
        connection: PoolProxiedConnection | None = None
        switched: bool | None = None
        alone = committing = False
        try:
            connection = self._connect()
            switched = self._autocommit(connection) if autocommit else None
            alone = switched is not None  # each statement commits by itself
            committing = alone
            result = self._execute(connection, plan())
            committing = True
            if not alone:
                self._commit(connection)
            return result, ambiguous
        except DBAPIError as exc:
            # In autocommit a statement the server refused did not commit; one whose
            # session ended meanwhile may have. Kept across attempts: a later one that
            # cannot connect must not forget it (the agent would be told nothing was
            # recorded, and record the call again).
            ambiguous = ambiguous or (committing and (not alone or cut_off(exc)))
            delay = retry_delay(exc, attempt, ambiguous=ambiguous, connecting=connection is None)
            return _Tried(delay), ambiguous
        finally:
            if connection is not None:
                if switched and connection.is_valid:
                    _lend_back(connection)
                connection.close()  # back to the pool, which rolls back what did not commit

    def _autocommit(self, connection: PoolProxiedConnection) -> bool | None:
        """Put ``connection`` in autocommit: True when this switched it (and must switch it
        back), False when it was in autocommit already, None when the driver has no such
        switch (the plan then runs in a transaction, committed at its end)."""
        driver = connection.dbapi_connection
        if driver is None or not hasattr(driver, "autocommit"):
            return None
        if driver.autocommit:
            return False
        try:
            driver.autocommit = True
        except self._error as exc:  # a connection the server closed meanwhile
            raise self._translated(exc, connection, None) from exc
        return True

    def _connect(self) -> PoolProxiedConnection:
        try:
            return self._engine.raw_connection()
        except self._error as exc:
            raise self._translated(exc, None, None) from exc

    def _execute(self, connection: PoolProxiedConnection, plan: Plan[T]) -> T:
        """:func:`~agent_blackbox.outbox._postgres.execute` on the DB-API cursor."""
        cursor = connection.cursor()
        walk = Stepper(plan)
        while (statement := walk.next()) is not None:
            clause, params = statement
            try:
                cursor.execute(self._compiled(clause), params)
                walk.reply(Rows(cursor, self._error))
            except self._error as exc:
                translated = self._translated(exc, connection, clause)
                if not isinstance(translated, IntegrityError):
                    raise refusal(translated) or translated from exc
                walk.fail(translated)
        return walk.result()

    def _commit(self, connection: PoolProxiedConnection) -> None:
        try:
            connection.commit()
        except self._error as exc:
            raise self._translated(exc, connection, None) from exc

    def _compiled(self, clause: TextClause) -> str:
        known = self._sql.get(id(clause))
        if known is None:
            sql = clause.compile(dialect=self._dialect).string
            _, binary = self._binary.get(id(clause), (clause, ()))
            for name in binary:
                sql = sql.replace(f"%({name})s", f"%({name})b")
            known = self._sql[id(clause)] = (clause, sql)
        return known[1]

    def _translated(
        self,
        exc: Exception,
        connection: PoolProxiedConnection | None,
        clause: TextClause | None,
    ) -> DBAPIError:
        """``exc`` as SQLAlchemy raises it, the connection invalidated when it is lost
        (the pool then never hands it out again)."""
        lost = connection is not None and self._dialect.is_disconnect(
            cast(Any, exc), connection.dbapi_connection, None
        )
        if lost and connection is not None:
            connection.invalidate(exc)
        translated = DBAPIError.instance(
            None if clause is None else self._compiled(clause),
            None,
            exc,
            self._error,
            hide_parameters=True,
            connection_invalidated=lost,
            dialect=self._dialect,
        )
        assert isinstance(translated, DBAPIError)  # exc is a DB-API error
        return translated
