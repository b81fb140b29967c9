"""Which tenants a role may act for (``blackbox.tenant_grants``).

A writer appends only for the tenants granted to it (or to a group role it belongs
to); readers and replayers see through row-level security only the runs of theirs.
``*`` grants every tenant. The schema's owner and superusers need no grant.
"""

from __future__ import annotations

import re

from sqlalchemy import Connection, text

EVERY_TENANT = "*"
"""The grant of every tenant."""

_ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")

# A grant names the role by name and oid: granting again after the role was dropped and
# created anew refreshes the oid; until then the new role holds none of the old grants.
_GRANT = text(
    "INSERT INTO blackbox.tenant_grants (role_name, tenant_id, role_oid) "
    "SELECT CAST(:role AS text), CAST(:tenant AS text), oid FROM pg_roles "
    "WHERE rolname = CAST(:role AS text) "
    "ON CONFLICT (role_name, tenant_id) DO UPDATE SET role_oid = excluded.role_oid, "
    "granted_at = now()"
)
_ROLE_EXISTS = text("SELECT 1 FROM pg_roles WHERE rolname = :role")
_REVOKE = text("DELETE FROM blackbox.tenant_grants WHERE role_name = :role AND tenant_id = :tenant")
_GRANTS = text(
    "SELECT role_name, tenant_id FROM blackbox.tenant_grants "
    "WHERE CAST(:role AS text) IS NULL OR role_name = :role ORDER BY role_name, tenant_id"
)


def _checked(role: str, tenant_id: str) -> None:
    if not _ROLE_NAME.fullmatch(role):
        raise ValueError(f"{role!r} is not a Postgres role name (letters, digits, _ and $)")
    if not tenant_id or len(tenant_id) > 200 or not tenant_id.isprintable():
        raise ValueError(f"{tenant_id!r} is not a tenant id (1 to 200 printable characters)")


def grant_tenant_txn(conn: Connection, role: str, tenant_id: str) -> None:
    """Let ``role`` (a login user or a group role) act for ``tenant_id`` (``*``: all).

    Raises:
        ValueError: ``role`` is not a role of this cluster, or the names are malformed.
    """
    _checked(role, tenant_id)
    if conn.execute(_ROLE_EXISTS, {"role": role}).first() is None:
        raise ValueError(
            f"there is no role {role!r} in this database cluster: create it first "
            f"(CREATE ROLE {role} LOGIN IN ROLE blackbox_writer, or _reader, _replayer)"
        )
    conn.execute(_GRANT, {"role": role, "tenant": tenant_id})


def revoke_tenant_txn(conn: Connection, role: str, tenant_id: str) -> bool:
    """Take back a grant; False when there was none."""
    _checked(role, tenant_id)
    return conn.execute(_REVOKE, {"role": role, "tenant": tenant_id}).rowcount == 1


def tenant_grants_txn(conn: Connection, role: str | None = None) -> list[tuple[str, str]]:
    """The grants, as ``(role, tenant)`` pairs, of ``role`` or of every role."""
    return [(str(r), str(t)) for r, t in conn.execute(_GRANTS, {"role": role})]
