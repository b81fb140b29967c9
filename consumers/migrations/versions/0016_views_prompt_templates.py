"""Run rollups name the prompt templates a run used.

Revision ID: 0016_views
Revises: 0015_views

``run_rollups.prompt_templates``: ``id@digest`` of each template in the run's snapshot
(the digest shortened to 12 hex characters), from ``run.started``'s unsealed attributes:
which version of each template a run used, next to the ``prompt_version`` tag.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_views"
down_revision: str | None = "0015_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def upgrade() -> None:
    """Add ``run_rollups.prompt_templates``."""
    op.add_column("run_rollups", sa.Column("prompt_templates", sa.Text), schema=SCHEMA)


def downgrade() -> None:
    """Drop it."""
    op.drop_column("run_rollups", "prompt_templates", schema=SCHEMA)
