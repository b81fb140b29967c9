"""Runs whose data keys were destroyed: ``limited_replay`` and ``redacted_at``.

Revision ID: 0003_views
Revises: 0002_views
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_views"
down_revision: str | None = "0002_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def upgrade() -> None:
    """Add the two columns a ``run.redacted`` event sets."""
    op.add_column(
        "runs",
        sa.Column("limited_replay", sa.Boolean, nullable=False, server_default=sa.false()),
        schema=SCHEMA,
    )
    op.add_column("runs", sa.Column("redacted_at", sa.DateTime(timezone=True)), schema=SCHEMA)


def downgrade() -> None:
    """Drop them."""
    op.drop_column("runs", "redacted_at", schema=SCHEMA)
    op.drop_column("runs", "limited_replay", schema=SCHEMA)
