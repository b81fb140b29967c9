"""The relay's own role.

Revision ID: 0003
Revises: 0002

- ``blackbox_relay`` (the outbox relay): reads and deletes outbox rows, and keeps its
  shard leases and membership heartbeats. It reads no run, no blob and no key: it moves
  envelopes as they are (sealed bodies stay sealed).
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"
ROLE = "blackbox_relay"


def upgrade() -> None:
    # Roles belong to the cluster, not the database: create it only where missing.
    op.execute(
        f"""
        DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                CREATE ROLE {ROLE} NOLOGIN;
            END IF;
        END $$
        """
    )
    op.execute(f"GRANT USAGE ON SCHEMA {SCHEMA} TO {ROLE}")
    op.execute(f"GRANT SELECT, DELETE ON {SCHEMA}.outbox TO {ROLE}")
    op.execute(
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {SCHEMA}.relay_leases, "
        f"{SCHEMA}.relay_members TO {ROLE}"
    )


def downgrade() -> None:
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM {ROLE}")
    op.execute(f"REVOKE USAGE ON SCHEMA {SCHEMA} FROM {ROLE}")
