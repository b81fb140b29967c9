"""Signed checkpoints, and the chain heads the signer follows.

Revision ID: 0004_views
Revises: 0003_views
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_views"
down_revision: str | None = "0003_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``chain_heads`` (the signer's own) and ``checkpoints`` (readable by all)."""
    op.create_table(
        "chain_heads",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("last_sequence", sa.BigInteger, nullable=False),
        sa.Column("chain_head", sa.Text, nullable=False),
        sa.Column("broken_at", sa.BigInteger),
        schema=SCHEMA,
    )
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("last_sequence", sa.BigInteger, nullable=False),
        sa.Column("chain_head", sa.Text, nullable=False),
        sa.Column("signer_key_id", sa.Text, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("signed_at", _TZ, nullable=False, server_default=sa.func.now()),
        schema=SCHEMA,
    )
    for role in ("blackbox_reader", "blackbox_replayer"):
        op.execute(f"GRANT SELECT ON {SCHEMA}.checkpoints TO {role}")


def downgrade() -> None:
    """Drop both."""
    op.drop_table("checkpoints", schema=SCHEMA)
    op.drop_table("chain_heads", schema=SCHEMA)
