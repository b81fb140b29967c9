"""The attacker's seat: login users in each role, on the real stack.

``login(role, tenant=...)`` creates a Postgres login user that is a member of ``role``
(``blackbox_writer``, ``blackbox_reader``, ``blackbox_replayer``, ``blackbox_relay``),
optionally granted one tenant, and returns an engine connected as that user. The users
are dropped at the end of the test. The services, the per-test database and the settings
come from ``tests/conftest.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from agent_blackbox.outbox import grant_tenant_txn

TENANT_A = "tenant-a"
TENANT_B = "tenant-b"

Login = Callable[..., Engine]


@pytest.fixture
def login(engine: Engine, database_url: str) -> Iterator[Login]:
    made: list[tuple[str, Engine]] = []

    def connect(role: str, *, tenant: str | None = None) -> Engine:
        user = f"sec_{role.removeprefix('blackbox_')}_{uuid.uuid4().hex[:8]}"
        with engine.begin() as conn:
            conn.execute(text(f"CREATE ROLE {user} LOGIN IN ROLE {role}"))
            if tenant is not None:
                grant_tenant_txn(conn, user, tenant)
        user_engine = create_engine(make_url(database_url).set(username=user, password=None))
        made.append((user, user_engine))
        return user_engine

    yield connect
    for user, user_engine in made:
        user_engine.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"REASSIGN OWNED BY {user} TO CURRENT_USER"))
            conn.execute(text(f"DROP OWNED BY {user}"))
            conn.execute(text(f"DROP ROLE IF EXISTS {user}"))
