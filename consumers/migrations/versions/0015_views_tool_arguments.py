"""LLM calls record how many of the tool calls the model asked for broke the schema.

Revision ID: 0015_views
Revises: 0014_views

``llm_calls.tool_calls_invalid``: of the tool calls in the reply, how many had arguments
that were not JSON or did not match the JSON Schema the request declared for that
function; NULL when the request declared no schema for the tools called (unknown).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_views"
down_revision: str | None = "0014_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def upgrade() -> None:
    """Add ``llm_calls.tool_calls_invalid``."""
    op.add_column("llm_calls", sa.Column("tool_calls_invalid", sa.Integer), schema=SCHEMA)


def downgrade() -> None:
    """Drop it."""
    op.drop_column("llm_calls", "tool_calls_invalid", schema=SCHEMA)
