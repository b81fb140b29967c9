"""The analytics views: one row per LLM call, per tool call, per effect intent.

Revision ID: 0008_views
Revises: 0007_views

Built by the analytics consumer from the envelopes' unsealed attributes only (provider,
model, tokens, latency, finish reason, error class, tool, effect, status), so they need
no data key and hold no body. An effect is keyed by a digest of its idempotency key: the
key is the agent's value and may name a customer. Readers and replayers read them,
scoped by tenant as the other views are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

revision = "0008_views"
down_revision: str | None = "0007_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
ROLES = ("blackbox_reader", "blackbox_replayer")
_GRANTED = "CAST((SELECT blackbox.granted_tenants()) AS text[])"
_MINE = f"(tenant_id = ANY ({_GRANTED}) OR '*' = ANY ({_GRANTED}))"
TABLES = ("llm_calls", "tool_calls", "effects")


def _call_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("sequence", sa.BigInteger, primary_key=True),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latency_ms", sa.Float),
        sa.Column("error_class", sa.Text),
    ]


def upgrade() -> None:
    """Create the three tables, their indexes, grants and read policies."""
    op.create_table(
        "llm_calls",
        *_call_columns(),
        sa.Column("provider", sa.Text),
        sa.Column("model", sa.Text),
        sa.Column("prompt_tokens", sa.BigInteger),
        sa.Column("completion_tokens", sa.BigInteger),
        sa.Column("cached_tokens", sa.BigInteger),
        sa.Column("total_tokens", sa.BigInteger),
        sa.Column("finish_reason", sa.Text),
        sa.Column("truncated", sa.Boolean, nullable=False, server_default=sa.text("false")),
        schema=SCHEMA,
    )
    op.create_index("ix_llm_calls_at", "llm_calls", ["recorded_at"], schema=SCHEMA)
    op.create_index("ix_llm_calls_model", "llm_calls", ["model", "recorded_at"], schema=SCHEMA)
    op.create_table("tool_calls", *_call_columns(), sa.Column("tool", sa.Text), schema=SCHEMA)
    op.create_index("ix_tool_calls_tool", "tool_calls", ["tool", "recorded_at"], schema=SCHEMA)
    op.create_table(
        "effects",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("key_digest", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("effect", sa.Text),
        sa.Column("intent_sequence", sa.BigInteger),
        sa.Column("intent_at", sa.DateTime(timezone=True)),
        sa.Column("receipt_sequence", sa.BigInteger),
        sa.Column("receipt_at", sa.DateTime(timezone=True)),
        sa.Column("status", sa.Text),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_effects_open",
        "effects",
        ["intent_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("receipt_sequence IS NULL"),
    )
    for role in ROLES:
        op.execute(f"GRANT SELECT ON {', '.join(f'{SCHEMA}.{t}' for t in TABLES)} TO {role}")
    found = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    if found.scalar() is None:
        return  # no write side here: nothing to scope by (as revision 0006 says)
    for table in TABLES:
        op.execute(f"ALTER TABLE {SCHEMA}.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY {table}_of_granted_tenants ON {SCHEMA}.{table} "
            f"FOR SELECT USING ({_MINE})"
        )


def downgrade() -> None:
    """Drop the three tables."""
    for table in TABLES:
        op.drop_table(table, schema=SCHEMA)
