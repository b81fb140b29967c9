"""The pool policy: how many connections each kind of process keeps, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import URL, Engine, NullPool, create_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

IsolationLevel = Literal["AUTOCOMMIT", "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]


@dataclass(frozen=True, slots=True)
class Pool:
    """How many database connections one kind of process keeps open, and how many it
    may open at most (``size + overflow``); a checkout beyond that waits for a return.

    Attributes:
        role: the kind of process, as the pool policy names it.
        size: connections kept open once used. 0 keeps none: every checkout opens a
            connection of its own, closed when it is returned.
        overflow: connections opened beyond ``size`` under a burst, closed when
            returned.
        pre_ping: whether a pooled connection is tested before it is handed out.
    """

    role: str
    size: int
    overflow: int = 0
    pre_ping: bool = False

    def __post_init__(self) -> None:
        """Raise ValueError for a negative size or overflow, or an overflow without a
        pool to overflow."""
        if self.size < 0 or self.overflow < 0 or (self.size == 0 and self.overflow):
            raise ValueError(
                f"pool {self.role!r}: size {self.size} and overflow {self.overflow} must "
                "be 0 or more, and a pool of size 0 has no overflow"
            )

    def engine(self, url: str | URL, *, isolation_level: IsolationLevel | None = None) -> Engine:
        """An engine for ``url`` with this pool (no connection is opened yet).

        Raises:
            sqlalchemy.exc.ArgumentError: ``url`` is not a database URL.
            sqlalchemy.exc.NoSuchModuleError: it names a driver that is not installed.
        """
        options = self._options()
        if isolation_level is not None:
            options["isolation_level"] = isolation_level
        return create_engine(url, **options)

    def async_engine(self, url: str | URL) -> AsyncEngine:
        """An asyncio engine for ``url`` with this pool; raises as :meth:`engine`."""
        # Imported here: most processes never open an async engine.
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(url, **self._options())

    def _options(self) -> dict[str, Any]:
        if self.size == 0:
            return {"poolclass": NullPool}
        return {
            "pool_size": self.size,
            "max_overflow": self.overflow,
            "pool_pre_ping": self.pre_ping,
        }


AGENT_POOL = Pool("agent", size=10, overflow=20)
"""An agent's recorder (``Recorder.from_settings``, the demo's agents): many runs record
at once from threads or tasks, each holding a connection for one short transaction per
event. No pre-ping: it would add a round trip to every event."""

COMMAND_POOL = Pool("command", size=2, overflow=10)
"""One ``blackbox`` command (replay, verify, export, fork, a drill, ...): a connection or
two at a time (an index lookup while a body or a key is read), for minutes at most."""

SERVICE_POOL = Pool("service", size=5, overflow=15, pre_ping=True)
"""A process that runs for days: the relay, a consumer, the retention job, the backup
writer, the run console. A few connections stay open; bursts (the console's concurrent
pages, the relay's lease heartbeat beside its batches) open more. Pre-ping: a connection
the database dropped (a restart, a failover) is replaced before use, not failed."""

MIGRATION_POOL = Pool("migration", size=0)
"""A migration: one connection for the duration, none kept afterwards."""

POOLS = (AGENT_POOL, COMMAND_POOL, SERVICE_POOL, MIGRATION_POOL)
"""The whole policy."""
