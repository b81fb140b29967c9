"""Where a drill or a restore puts the restored copy: a database and topics of its own.

A target is a new Postgres database owned by a new login role with a random password,
which only that role may connect to (``CONNECT`` is revoked from ``PUBLIC``, so no
production login reaches it), migrated by that role; and a new topic prefix for the
restored events and their dead-letter topic. Everything the drill does to the copy it
does with the target's credentials; the production credentials only create the target
and, at the end, drop it.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from agent_blackbox.backup._errors import BackupError, first_line
from agent_blackbox.broker import KafkaUnavailable, default_topics, delete_topics, ensure_topics
from agent_blackbox.consumers import MigrationFailed, migrate_views
from agent_blackbox.outbox.storage import migrate_write_side
from agent_blackbox.schemas import BlackboxError, Settings
from agent_blackbox.wiring import COMMAND_POOL

_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")


class TargetError(BackupError):
    """The isolated target could not be created or dropped."""


@dataclass(frozen=True, slots=True)
class Target:
    """A restored copy's database and topics, and the credentials that reach them."""

    name: str
    settings: Settings
    """The target's database URL (its own role) and topic, else production's settings."""
    created: bool
    """Made by the drill (and so dropped by it), not given."""

    @property
    def database(self) -> str:
        return make_url(self.settings.database_url).database or ""

    def describe(self) -> str:
        url = make_url(self.settings.database_url).render_as_string(hide_password=True)
        return f"database {url}, topic {self.settings.topic}"


def target_name(prefix: str = "drill") -> str:
    """A fresh name for a target: ``<prefix>_<UTC time>_<random>``."""
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    return f"blackbox_{prefix}_{stamp}_{secrets.token_hex(3)}"


def create_target(production: Settings, name: str, *, partitions: int) -> Target:
    """Create the database, its role and the topics of target ``name``.

    Args:
        production: the production settings; its database user needs CREATEDB and
            CREATEROLE (or to be a superuser) on the server.
        name: lower-case letters, digits and ``_`` (database, role and topic prefix).
        partitions: the restored event topic's partition count (the backed-up one's).

    Raises:
        TargetError: the name is not usable, or the server refused.
        KafkaUnavailable: the topics could not be created.
    """
    if _NAME.fullmatch(name) is None:
        raise TargetError(
            f"target name {name!r}: use lower-case letters, digits and _ (at most 41), "
            "starting with a letter"
        )
    password = secrets.token_urlsafe(24)
    admin = _admin(production)
    try:
        _refuse_existing(admin, name)
        made = False
        try:
            with admin.connect() as conn:
                # A utility statement takes no bound parameter; the password is URL-safe
                # base64, generated here.
                conn.execute(text(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
                made = True
                conn.execute(text(f"CREATE DATABASE {name} OWNER {name}"))
                conn.execute(text(f"REVOKE ALL ON DATABASE {name} FROM PUBLIC"))
                conn.execute(text(f"GRANT CONNECT, TEMPORARY ON DATABASE {name} TO {name}"))
        except BaseException as exc:
            if made:  # never what someone else made: only this call's role and database
                _drop_database(admin, name)
            if isinstance(exc, SQLAlchemyError):
                raise TargetError(_refusal(name, exc)) from exc
            raise
    finally:
        admin.dispose()
    url = make_url(production.database_url).set(username=name, password=password, database=name)
    settings = replace(
        production,
        database_url=url.render_as_string(hide_password=False),
        topic=f"{name}.{production.topic}",
        partitions=partitions,
        consumer_group=f"{name}-views",
    )
    target = Target(name=name, settings=settings, created=True)
    try:
        migrate_write_side(settings.database_url)
        migrate_views(settings.database_url)
        ensure_topics(settings, default_topics(settings))
    except BaseException as exc:
        drop_target(production, target)
        if isinstance(exc, (BlackboxError, MigrationFailed)):
            raise TargetError(f"cannot prepare the target {name}: {exc}") from exc
        raise
    return target


def copy_exists(production: Settings, name: str) -> bool:
    """Whether a restored copy's database or role named ``name`` exists.

    Raises:
        TargetError: the database server cannot be asked.
    """
    admin = _admin(production)
    try:
        return _taken(admin, name)
    finally:
        admin.dispose()


def _taken(admin: Engine, name: str) -> bool:
    try:
        with admin.connect() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :n) "
                        "OR EXISTS (SELECT 1 FROM pg_database WHERE datname = :n)"
                    ),
                    {"n": name},
                ).scalar_one()
            )
    except SQLAlchemyError as exc:
        raise TargetError(_refusal(name, exc)) from exc


def _refuse_existing(admin: Engine, name: str) -> None:
    if _taken(admin, name):
        raise TargetError(
            f"a restored copy named {name} exists already (its database or role); drop it "
            "first or choose another name"
        )


def _refusal(name: str, exc: SQLAlchemyError) -> str:
    if isinstance(exc, OperationalError):
        return (
            f"cannot reach the database server to create {name}: {first_line(exc)}; check "
            "BLACKBOX_DATABASE_URL"
        )
    return (
        f"cannot create the target database {name}: {first_line(exc)}; the production "
        "database user needs CREATEDB and CREATEROLE to make an isolated target"
    )


def existing_target(production: Settings, name: str) -> Target:
    """The target :func:`create_target` made under ``name`` (to drop it)."""
    return Target(
        name=name, settings=replace(production, topic=f"{name}.{production.topic}"), created=True
    )


def drop_target(production: Settings, target: Target) -> list[str]:
    """Drop a created target's topics, database and role; what could not be dropped."""
    left: list[str] = []
    try:
        delete_topics(production, [target.settings.topic, target.settings.dlq_topic])
    except KafkaUnavailable as exc:
        left.append(f"topics {target.settings.topic}*: {exc}")
    if target.created:
        admin = _admin(production)
        try:
            problem = _drop_database(admin, target.name)
        finally:
            admin.dispose()
        if problem:
            left.append(f"database {target.name}: {problem}")
    return left


def _admin(production: Settings) -> Engine:
    # The server's maintenance database, not production's: a drill must also run once
    # the production database is gone (and a database cannot be dropped from inside).
    url = make_url(production.database_url).set(database="postgres")
    return COMMAND_POOL.engine(url, isolation_level="AUTOCOMMIT")


def _drop_database(admin: Engine, name: str) -> str | None:
    try:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            conn.execute(text(f"DROP ROLE IF EXISTS {name}"))
    except SQLAlchemyError as exc:
        return first_line(exc)
    return None


def target_engine(target: Target) -> Engine:
    """An engine on the target's database, as the target's own role."""
    return COMMAND_POOL.engine(target.settings.database_url)
