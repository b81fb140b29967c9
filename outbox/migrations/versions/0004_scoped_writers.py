"""Tenants per role: which tenants a login role may write, read or replay.

Revision ID: 0004
Revises: 0003

``blackbox.tenant_grants`` names, for a role (a login user or a group it belongs to),
the tenants it may act for (``*`` is every tenant). The write side's functions and the
row-level security policies ask :func:`blackbox.granted_tenant` whether the session's
user may act for a tenant; the schema's owner and superusers always may.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"


def upgrade() -> None:
    op.create_table(
        "tenant_grants",
        sa.Column("role_name", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, primary_key=True),
        sa.Column(
            "granted_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    # SECURITY DEFINER: callers may not read the grants table, only ask about themselves.
    # session_user, not current_user: inside a definer function current_user is the owner.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.granted_tenant(p_tenant_id text) RETURNS boolean
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
            SELECT EXISTS (
                       SELECT 1 FROM {SCHEMA}.tenant_grants g
                        WHERE g.tenant_id IN (p_tenant_id, '*')
                          AND EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = g.role_name)
                          AND pg_has_role(session_user, g.role_name, 'MEMBER'))
                OR EXISTS (SELECT 1 FROM pg_roles r
                            WHERE r.rolname = session_user AND r.rolsuper)
                OR EXISTS (SELECT 1 FROM pg_namespace n
                            WHERE n.nspname = '{SCHEMA}'
                              AND pg_has_role(session_user, n.nspowner, 'MEMBER'))
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.granted_tenant(text) FROM PUBLIC")
    for role in ("blackbox_writer", "blackbox_reader", "blackbox_replayer", "blackbox_relay"):
        op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.granted_tenant(text) TO {role}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.granted_tenant(text)")
    op.drop_table("tenant_grants", schema=SCHEMA)
