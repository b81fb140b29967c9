"""Creating and upgrading the read-side tables with this package's alembic environment."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from agent_blackbox.consumers._errors import MigrationFailed
from agent_blackbox.schemas import driver_cause, unreachable_database

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def views_alembic_config(database_url: str) -> Config:
    """An alembic ``Config`` for the views environment, pointed at ``database_url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolates '%', which percent-encoded passwords contain.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def migrate_views(database_url: str) -> None:
    """Create the ``blackbox_views`` schema and upgrade its tables to the newest revision.

    Idempotent and safe to call from several processes at once (an advisory lock
    serialises them). Touches nothing outside ``blackbox_views``.

    Raises:
        MigrationFailed: the database is unreachable or refused a migration step.
    """
    try:
        command.upgrade(views_alembic_config(database_url), "head")
    except (SQLAlchemyError, CommandError) as exc:
        cause = driver_cause(exc)
        if isinstance(exc, OperationalError | InterfaceError):
            raise MigrationFailed(unreachable_database(cause, _redacted(database_url))) from exc
        raise MigrationFailed(
            f"could not migrate the views in {_redacted(database_url)}: {cause}; check that "
            "the user may create schemas and tables in it"
        ) from exc


def _redacted(database_url: str) -> str:
    try:
        return make_url(database_url).render_as_string(hide_password=True)
    except SQLAlchemyError:
        return "the configured database"
