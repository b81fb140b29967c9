"""Alembic environment of the ``blackbox_views`` schema.

Run programmatically by :func:`agent_blackbox.consumers.migrate_views`; there is no ``alembic.ini``.
The version table lives in ``blackbox_views.alembic_version_views`` so this history
never mixes with the write side's own alembic environment.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from agent_blackbox.consumers._tables import VIEWS_SCHEMA, metadata
from agent_blackbox.wiring import MIGRATION_POOL

VERSION_TABLE = "alembic_version_views"

# Two consumers starting at once must not race on CREATE SCHEMA or on the version
# table; a transaction-scoped advisory lock serialises them.
_MIGRATION_LOCK = 0x626C_6B76_6965_7773  # "blkviews"


def _run(connection: Connection) -> None:
    with connection.begin():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{VIEWS_SCHEMA}"'))
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            version_table_schema=VIEWS_SCHEMA,
            include_schemas=True,
        )
        with context.begin_transaction():
            context.run_migrations()


def _run_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "sqlalchemy.url is not set; call agent_blackbox.consumers.migrate_views(url)"
        )
    engine = MIGRATION_POOL.engine(url)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported for blackbox_views")
_run_online()
