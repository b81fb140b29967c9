"""What LLM calls cost, per call, per run and in the usage buckets.

Revision ID: 0018_views
Revises: 0017_views

- ``llm_calls`` gains ``cache_write_tokens`` (input written to the provider's prompt
  cache, priced above the input price: Anthropic's cache writes), ``cost_usd`` (exact,
  ``numeric``: the call's tokens at the price of its model when the analytics consumer
  read it; NULL when its model has no price or it reported no usage) and
  ``price_as_of`` (the day of the price used).
- ``run_rollups`` gains ``cached_tokens``, ``cost_usd`` (the sum of its priced calls;
  NULL while none is priced) and ``unpriced_calls`` (calls that did not fail whose cost
  is unknown): a run's cost is never shown as complete when part of it is unknown.
- ``llm_usage`` sums ``cached_tokens`` and ``cost_usd`` and counts ``unpriced_calls``
  per bucket, so cost per model, prompt version and code version over time is a query.

Calls and runs projected before this revision keep NULL costs (a rebuild of the
analytics views from offset zero prices them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_views"
down_revision: str | None = "0017_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_PERCENTILES = ", ".join(
    f"percentile_cont({q}) WITHIN GROUP (ORDER BY c.latency_ms) AS latency_p{int(q * 100)}_ms"
    for q in (0.5, 0.95, 0.99)
)
UNPRICED = "c.cost_usd IS NULL AND c.error_class IS NULL"
"""A call whose cost is unknown: it did not fail (a failed call is not billed) and has
no cost (no price for its model, or no usage reported)."""


def _llm_usage(*, costs: bool) -> str:
    extra = (
        ", coalesce(sum(c.cached_tokens), 0) AS cached_tokens, sum(c.cost_usd) AS cost_usd"
        f", count(*) FILTER (WHERE {UNPRICED}) AS unpriced_calls"
        if costs
        else ""
    )
    return f"""
        CREATE VIEW {SCHEMA}.llm_usage WITH (security_invoker = true) AS
        SELECT b.bucket_size, date_trunc(b.bucket_size, c.recorded_at) AS bucket,
               c.tenant_id, c.agent_id, c.provider, c.model, c.prompt_version,
               r.code_version,
               count(*) AS calls, count(c.error_class) AS errors,
               coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens,
               coalesce(sum(c.completion_tokens), 0) AS completion_tokens,
               coalesce(sum(c.total_tokens), 0) AS total_tokens, {_PERCENTILES}{extra}
          FROM {SCHEMA}.llm_calls c
          CROSS JOIN (VALUES ('minute'), ('hour')) AS b(bucket_size)
          LEFT JOIN {SCHEMA}.runs r ON r.run_id = c.run_id
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
    """


def _count(name: str, kind: type[sa.types.TypeEngine[int]] = sa.Integer) -> sa.Column[int]:
    return sa.Column(name, kind, nullable=False, server_default=sa.text("0"))


def upgrade() -> None:
    """Add the cost columns and recreate ``llm_usage`` with them."""
    op.add_column("llm_calls", sa.Column("cache_write_tokens", sa.BigInteger), schema=SCHEMA)
    op.add_column("llm_calls", sa.Column("cost_usd", sa.Numeric), schema=SCHEMA)
    op.add_column("llm_calls", sa.Column("price_as_of", sa.Date), schema=SCHEMA)
    op.add_column("run_rollups", _count("cached_tokens", sa.BigInteger), schema=SCHEMA)
    op.add_column("run_rollups", sa.Column("cost_usd", sa.Numeric), schema=SCHEMA)
    op.add_column("run_rollups", _count("unpriced_calls"), schema=SCHEMA)
    op.execute(f"DROP VIEW {SCHEMA}.llm_usage")
    op.execute(_llm_usage(costs=True))
    op.execute(f"GRANT SELECT ON {SCHEMA}.llm_usage TO blackbox_reader, blackbox_replayer")


def downgrade() -> None:
    """Drop the cost columns; ``llm_usage`` as revision 0012 made it."""
    op.execute(f"DROP VIEW {SCHEMA}.llm_usage")
    for table, names in (
        ("llm_calls", ("cache_write_tokens", "cost_usd", "price_as_of")),
        ("run_rollups", ("cached_tokens", "cost_usd", "unpriced_calls")),
    ):
        for name in names:
            op.drop_column(table, name, schema=SCHEMA)
    op.execute(_llm_usage(costs=False))
    op.execute(f"GRANT SELECT ON {SCHEMA}.llm_usage TO blackbox_reader, blackbox_replayer")
