"""Per-run rollups and prompt versions for the analytics views, and the run list's index.

Revision ID: 0012_views
Revises: 0011_views

- ``run_rollups``: one row per run, from the analytics consumer: the run's code version,
  tags and prompt version (from ``run.started``), and its LLM and tool calls summed
  (calls, errors, tokens, latency, the models it called). The run console filters on it.
- ``llm_calls`` gains the run's prompt version and code version, whether the call was
  streamed and how many tool calls the model asked for; ``llm_usage`` groups by the
  prompt version too.
- ``runs`` gains an index on (started_at, run_id), newest first: the run list's order.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0012_views"
down_revision: str | None = "0011_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_GRANTED = "CAST((SELECT blackbox.granted_tenants()) AS text[])"
_MINE = f"(tenant_id = ANY ({_GRANTED}) OR '*' = ANY ({_GRANTED}))"
_PERCENTILES = ", ".join(
    f"percentile_cont({q}) WITHIN GROUP (ORDER BY c.latency_ms) AS latency_p{int(q * 100)}_ms"
    for q in (0.5, 0.95, 0.99)
)


def _count(name: str, kind: type[sa.types.TypeEngine[int]] = sa.Integer) -> sa.Column[int]:
    return sa.Column(name, kind, nullable=False, server_default=sa.text("0"))


def _llm_usage(prompt: str) -> str:
    keys = ", ".join(str(i) for i in range(1, 8 + bool(prompt)))
    return f"""
        CREATE VIEW {SCHEMA}.llm_usage WITH (security_invoker = true) AS
        SELECT b.bucket_size, date_trunc(b.bucket_size, c.recorded_at) AS bucket,
               c.tenant_id, c.agent_id, c.provider, c.model{prompt}, r.code_version,
               count(*) AS calls, count(c.error_class) AS errors,
               coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens,
               coalesce(sum(c.completion_tokens), 0) AS completion_tokens,
               coalesce(sum(c.total_tokens), 0) AS total_tokens, {_PERCENTILES}
          FROM {SCHEMA}.llm_calls c
          CROSS JOIN (VALUES ('minute'), ('hour')) AS b(bucket_size)
          LEFT JOIN {SCHEMA}.runs r ON r.run_id = c.run_id
         GROUP BY {keys}
    """


def upgrade() -> None:
    """Create ``run_rollups``, add the call columns, recreate ``llm_usage``, index runs."""
    op.create_table(
        "run_rollups",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("code_version", sa.Text),
        sa.Column("prompt_version", sa.Text),
        sa.Column("tags", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        _count("llm_calls"),
        _count("tool_calls"),
        _count("errors"),
        _count("streamed_calls"),
        _count("prompt_tokens", sa.BigInteger),
        _count("completion_tokens", sa.BigInteger),
        _count("total_tokens", sa.BigInteger),
        sa.Column("llm_latency_ms", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("max_latency_ms", sa.Float),
        sa.Column("models", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'")),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_run_rollups_prompt", "run_rollups", ["prompt_version", "started_at"], schema=SCHEMA
    )
    op.create_index(
        "ix_run_rollups_models", "run_rollups", ["models"], schema=SCHEMA, postgresql_using="gin"
    )
    for name, kind in (
        ("prompt_version", sa.Text),
        ("code_version", sa.Text),
        ("streamed", sa.Boolean),
        ("tool_calls_requested", sa.Integer),
    ):
        op.add_column("llm_calls", sa.Column(name, kind), schema=SCHEMA)
    op.execute(
        f"CREATE INDEX ix_runs_started ON {SCHEMA}.runs (started_at DESC NULLS LAST, run_id DESC)"
    )
    op.execute(f"DROP VIEW {SCHEMA}.llm_usage")
    op.execute(_llm_usage(", c.prompt_version"))
    roles = "blackbox_reader, blackbox_replayer"
    op.execute(f"GRANT SELECT ON {SCHEMA}.llm_usage, {SCHEMA}.run_rollups TO {roles}")
    found = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    if found.scalar() is None:
        return  # no write side here: nothing to scope by (as revision 0006 says)
    op.execute(f"ALTER TABLE {SCHEMA}.run_rollups ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY run_rollups_of_granted_tenants ON {SCHEMA}.run_rollups "
        f"FOR SELECT USING ({_MINE})"
    )


def downgrade() -> None:
    """Drop what :func:`upgrade` made and give ``llm_usage`` its former shape."""
    op.drop_table("run_rollups", schema=SCHEMA)
    op.execute(f"DROP INDEX IF EXISTS {SCHEMA}.ix_runs_started")
    op.execute(f"DROP VIEW {SCHEMA}.llm_usage")
    for name in ("prompt_version", "code_version", "streamed", "tool_calls_requested"):
        op.drop_column("llm_calls", name, schema=SCHEMA)
    op.execute(_llm_usage(""))
    op.execute(f"GRANT SELECT ON {SCHEMA}.llm_usage TO blackbox_reader, blackbox_replayer")
