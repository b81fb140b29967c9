"""Replay results: one row per run replayed by ``blackbox replay``, so a pass rate per
code version is a query.

Revision ID: 0009_views
Revises: 0008_views

Written by the replay command as the replayer role (``INSERT`` granted), each row taking
its tenant from the runs view in the same statement, so a replayer records results only
of runs it may read; readers and replayers read them scoped by tenant.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

revision = "0009_views"
down_revision: str | None = "0008_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_GRANTED = "CAST((SELECT blackbox.granted_tenants()) AS text[])"
_MINE = f"(tenant_id = ANY ({_GRANTED}) OR '*' = ANY ({_GRANTED}))"


def upgrade() -> None:
    """Create the table, its index, grants and policies."""
    op.create_table(
        "replay_results",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text),
        sa.Column("recorded_code_version", sa.Text),
        sa.Column("code_version", sa.Text),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("passed", sa.Boolean, nullable=False),
        sa.Column("divergence_kind", sa.Text),
        sa.Column("divergence_sequence", sa.BigInteger),
        sa.Column("events", sa.BigInteger, nullable=False),
        sa.Column("duration_ms", sa.Float),
        sa.Column(
            "replayed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_replay_results_version",
        "replay_results",
        ["code_version", "replayed_at"],
        schema=SCHEMA,
    )
    op.execute(f"GRANT SELECT ON {SCHEMA}.replay_results TO blackbox_reader, blackbox_replayer")
    op.execute(f"GRANT INSERT ON {SCHEMA}.replay_results TO blackbox_replayer")
    found = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    if found.scalar() is None:
        return  # no write side here: nothing to scope by (as revision 0006 says)
    op.execute(f"ALTER TABLE {SCHEMA}.replay_results ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY replay_results_of_granted_tenants ON {SCHEMA}.replay_results "
        f"FOR SELECT USING ({_MINE})"
    )
    op.execute(
        f"CREATE POLICY replay_results_recorded_for_granted_tenants ON {SCHEMA}.replay_results "
        f"FOR INSERT WITH CHECK ({_MINE})"
    )


def downgrade() -> None:
    """Drop the table."""
    op.drop_table("replay_results", schema=SCHEMA)
