"""The events index keeps each envelope's unsealed attributes.

Revision ID: 0013_views
Revises: 0012_views

The run console shows an event's metadata (model, tokens, tool, status, the branch of
concurrent work it ran in) from the index, without reading Kafka. Attributes are
unsealed by design (redacted before the first write), so the index holds no more than
the topic shows any reader. Rows indexed before this revision have NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013_views"
down_revision: str | None = "0012_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def upgrade() -> None:
    """Add ``events.attributes``."""
    op.add_column("events", sa.Column("attributes", JSONB), schema=SCHEMA)


def downgrade() -> None:
    """Drop ``events.attributes``."""
    op.drop_column("events", "attributes", schema=SCHEMA)
