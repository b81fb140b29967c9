"""The signer checks the source of truth: what it needs to remember per run.

Revision ID: 0005_views
Revises: 0004_views

``chain_heads`` learns the run's tenant, whether its run.finished and a data key were
seen, how far the run was last signed and when an unsigned head is next due to be
compared with ``blackbox.runs`` (for mid-run checkpoints). ``checkpoints`` learns
whether the run had finished when signed (NULL: a first-form checkpoint, signed only at
a run's end).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_views"
down_revision: str | None = "0004_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Add the columns; heads signed by the first signer count as signed where they are."""
    op.add_column("chain_heads", sa.Column("tenant_id", sa.Text), schema=SCHEMA)
    for name in ("finished", "sealed"):
        op.add_column(
            "chain_heads",
            sa.Column(name, sa.Boolean, nullable=False, server_default=sa.false()),
            schema=SCHEMA,
        )
    op.add_column(
        "chain_heads",
        sa.Column("signed_sequence", sa.BigInteger, nullable=False, server_default="0"),
        schema=SCHEMA,
    )
    op.add_column("chain_heads", sa.Column("check_after", _TZ), schema=SCHEMA)
    op.create_index(
        "ix_chain_heads_check_after",
        "chain_heads",
        ["check_after"],
        schema=SCHEMA,
        postgresql_where=sa.text("check_after IS NOT NULL AND broken_at IS NULL"),
    )
    op.add_column("checkpoints", sa.Column("finished", sa.Boolean), schema=SCHEMA)
    op.execute(
        f"""
        UPDATE {SCHEMA}.chain_heads h SET signed_sequence = c.last_sequence, finished = true
          FROM {SCHEMA}.checkpoints c WHERE c.run_id = h.run_id
        """
    )
    # Heads the first signer never signed (running or crashed runs) are due at once, so
    # the sweep covers the history that is already there.
    op.execute(
        f"""
        UPDATE {SCHEMA}.chain_heads SET check_after = now()
         WHERE broken_at IS NULL AND last_sequence > signed_sequence
        """
    )


def downgrade() -> None:
    """Drop the columns."""
    op.drop_column("checkpoints", "finished", schema=SCHEMA)
    op.drop_index("ix_chain_heads_check_after", table_name="chain_heads", schema=SCHEMA)
    for name in ("check_after", "signed_sequence", "sealed", "finished", "tenant_id"):
        op.drop_column("chain_heads", name, schema=SCHEMA)
