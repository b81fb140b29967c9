"""Each consumer's epoch fence is stored beside its offsets.

Revision ID: 0007_views
Revises: 0006_views

``consumer_offsets`` learns ``lease_epochs``: per partition, the newest relay lease
epoch read for each outbox shard (JSON ``{"<shard>": <epoch>}``), written in the same
transaction as the offset, so a consumer that restarts or takes over the partition
drops a stale relay's copies exactly as its predecessor would have.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0007_views"
down_revision: str | None = "0006_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def upgrade() -> None:
    """Add the column; partitions read so far have seen no stamp yet."""
    op.add_column(
        "consumer_offsets",
        sa.Column("lease_epochs", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        schema=SCHEMA,
    )


def downgrade() -> None:
    """Drop the column."""
    op.drop_column("consumer_offsets", "lease_epochs", schema=SCHEMA)
