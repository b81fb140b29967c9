"""Usage per minute and per hour, as views over the analytics tables.

Revision ID: 0011_views
Revises: 0010_views

``llm_usage`` and ``tool_usage`` group the calls by time bucket (``minute`` and
``hour`` rows side by side, told apart by ``bucket_size``), agent, model or tool, code
version and tenant: calls, errors, tokens, and latency p50/p95/p99. The percentiles are
exact (``percentile_cont`` over the calls), computed when read: the tables keep one row
per call, so a query over a window reads just that window. ``security_invoker`` views: a
reader sees its granted tenants' figures only.
"""

from __future__ import annotations

from alembic import op

revision = "0011_views"
down_revision: str | None = "0010_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_PERCENTILES = ", ".join(
    f"percentile_cont({q}) WITHIN GROUP (ORDER BY c.latency_ms) AS latency_p{int(q * 100)}_ms"
    for q in (0.5, 0.95, 0.99)
)


def _view(name: str, table: str, what: str, extra: str) -> str:
    keys = ", ".join(str(i) for i in range(1, 6 + what.count(",") + 1))
    return f"""
        CREATE VIEW {SCHEMA}.{name} WITH (security_invoker = true) AS
        SELECT b.bucket_size, date_trunc(b.bucket_size, c.recorded_at) AS bucket,
               c.tenant_id, c.agent_id, {what}, r.code_version,
               count(*) AS calls, count(c.error_class) AS errors{extra}, {_PERCENTILES}
          FROM {SCHEMA}.{table} c
          CROSS JOIN (VALUES ('minute'), ('hour')) AS b(bucket_size)
          LEFT JOIN {SCHEMA}.runs r ON r.run_id = c.run_id
         GROUP BY {keys}
    """


def upgrade() -> None:
    """Create both views and grant them to readers and replayers."""
    tokens = (
        ", coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens"
        ", coalesce(sum(c.completion_tokens), 0) AS completion_tokens"
        ", coalesce(sum(c.total_tokens), 0) AS total_tokens"
    )
    op.execute(_view("llm_usage", "llm_calls", "c.provider, c.model", tokens))
    op.execute(_view("tool_usage", "tool_calls", "c.tool", ""))
    for name in ("llm_usage", "tool_usage"):
        op.execute(f"GRANT SELECT ON {SCHEMA}.{name} TO blackbox_reader, blackbox_replayer")


def downgrade() -> None:
    """Drop both views."""
    for name in ("llm_usage", "tool_usage"):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
