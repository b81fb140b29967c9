"""Runs the write side's alembic migrations programmatically."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from agent_blackbox.outbox._errors import DatabaseUnavailable
from agent_blackbox.schemas import driver_cause, unreachable_database
from agent_blackbox.wiring import MIGRATION_POOL

MIGRATIONS = Path(__file__).parent / "migrations"


def migrate_write_side(database: str | Engine) -> None:
    """Bring the ``blackbox`` schema to the newest revision (idempotent).

    Raises:
        DatabaseUnavailable: the database cannot be reached or refused the change.
    """
    # alembic is imported here, not with the module: an agent process imports the write
    # side's package but never migrates, and alembic alone costs more than the Recorder.
    from alembic import command
    from alembic.config import Config

    engine = MIGRATION_POOL.engine(database) if isinstance(database, str) else database
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        cause = driver_cause(exc)
        where = engine.url.render_as_string()
        if isinstance(exc, OperationalError | InterfaceError):
            raise DatabaseUnavailable(unreachable_database(cause, where)) from exc
        raise DatabaseUnavailable(
            f"could not migrate the write side at {where}: {cause}; check that the user "
            "may create schemas and tables in it"
        ) from exc
    finally:
        if isinstance(database, str):
            engine.dispose()
