"""A restored copy (a drill's target, or a restore for an investigation) holds production's
data, keys wrapped, and the ledger; no production login may reach it.

Attack: log in as each production role and connect to a restored copy's database; log in
as the copy's own role and reach production's. Both are refused: the copy's database
admits only its own role, and that role is not a member of any production role.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from agent_blackbox.backup import Target, create_target, drop_target
from agent_blackbox.schemas import Settings
from tests.conftest import Login

pytestmark = pytest.mark.integration

ROLES = ("blackbox_writer", "blackbox_reader", "blackbox_replayer", "blackbox_relay")


@pytest.fixture
def target(settings: Settings) -> Iterator[Target]:
    made = create_target(settings, f"blackbox_sec_{uuid.uuid4().hex[:10]}", partitions=1)
    yield made
    assert drop_target(settings, made) == []


@pytest.mark.parametrize("role", ROLES)
def test_no_production_role_connects_to_a_restored_copy(
    login: Login, target: Target, role: str
) -> None:
    production = login(role)
    copy_url = make_url(str(production.url)).set(database=target.database)
    intruder = create_engine(copy_url)
    try:
        with (
            pytest.raises(OperationalError, match="permission denied for database"),
            intruder.connect(),
        ):
            pass
    finally:
        intruder.dispose()


def test_the_copy_role_holds_no_production_role(settings: Settings, target: Target) -> None:
    copy = create_engine(target.settings.database_url)
    try:
        with copy.connect() as conn:
            held = (
                conn.execute(
                    text(
                        "SELECT r.rolname FROM pg_roles r WHERE pg_has_role(current_user, r.oid, "
                        "'MEMBER') AND r.rolname <> current_user"
                    )
                )
                .scalars()
                .all()
            )
    finally:
        copy.dispose()
    assert not [name for name in held if name.startswith("blackbox_") and name in ROLES]
    assert not [name for name in held if name == make_url(settings.database_url).username]
