"""Let the reader and replayer roles read the views.

Revision ID: 0002_views
Revises: 0001_views

The roles are the write side's (``blackbox_reader``, ``blackbox_replayer``); they are
created here too when missing, so the read side can be migrated on its own database.
"""

from __future__ import annotations

from alembic import op

revision = "0002_views"
down_revision: str | None = "0001_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
READERS = ("blackbox_reader", "blackbox_replayer")


def upgrade() -> None:
    """Create the roles where missing and grant them the views (never the offsets)."""
    for role in READERS:
        op.execute(
            f"""
            DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                    CREATE ROLE {role} NOLOGIN;
                END IF;
            END $$
            """
        )
        op.execute(f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}")
        op.execute(f"GRANT SELECT ON {SCHEMA}.runs, {SCHEMA}.events TO {role}")
        op.execute(f"GRANT SELECT ON {SCHEMA}.integrity_violations TO {role}")


def downgrade() -> None:
    """Take the grants back (the roles stay: other databases may use them)."""
    for role in READERS:
        op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM {role}")
        op.execute(f"REVOKE USAGE ON SCHEMA {SCHEMA} FROM {role}")
