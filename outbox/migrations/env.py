"""Alembic environment of the write side (schema ``blackbox``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from agent_blackbox.outbox._tables import SCHEMA, metadata
from agent_blackbox.wiring import MIGRATION_POOL

VERSION_TABLE = "alembic_version_outbox"


def _run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = MIGRATION_POOL.engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _migrate(conn)
    engine.dispose()


def _migrate(connection: object) -> None:
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))  # type: ignore[attr-defined]
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        version_table_schema=SCHEMA,
    )
    with context.begin_transaction():
        context.run_migrations()


_run()
