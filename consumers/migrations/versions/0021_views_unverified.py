"""Events the write side does not vouch for are marked, and left out of every total.

Revision ID: 0021_views
Revises: 0020_views

- ``events.unverified``: why the write side does not vouch for the event (a run it never
  recorded, a sequence past the run's head, after its ``run.finished``, a chain break);
  NULL when it does. A partial index on the marked events finds a run's marks (a
  run list asks for fifty runs at once) without reading its other events.
- ``runs.finished_sequence``: the sequence of the run's ``run.finished``, what an event
  after it is judged by; filled here for runs that finished before this revision.
- ``llm_calls.unverified`` and ``tool_calls.unverified``: the same mark on the call rows
  (the analytics consumer judges them as the views consumer does); ``llm_usage`` counts
  only unmarked calls.
- ``run_replayability`` says ``unverified`` for a run the write side never recorded.

Rows projected before this revision stay unmarked (a rebuild from offset zero judges
them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_views"
down_revision: str | None = "0020_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_PERCENTILES = ", ".join(
    f"percentile_cont({q}) WITHIN GROUP (ORDER BY c.latency_ms) AS latency_p{int(q * 100)}_ms"
    for q in (0.5, 0.95, 0.99)
)
_UNPRICED = "c.cost_usd IS NULL AND c.error_class IS NULL"


def _llm_usage(*, verified_only: bool) -> str:
    where = "WHERE c.unverified IS NULL" if verified_only else ""
    return f"""
        CREATE VIEW {SCHEMA}.llm_usage WITH (security_invoker = true) AS
        SELECT b.bucket_size, date_trunc(b.bucket_size, c.recorded_at) AS bucket,
               c.tenant_id, c.agent_id, c.provider, c.model, c.prompt_version,
               r.code_version,
               count(*) AS calls, count(c.error_class) AS errors,
               coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens,
               coalesce(sum(c.completion_tokens), 0) AS completion_tokens,
               coalesce(sum(c.total_tokens), 0) AS total_tokens, {_PERCENTILES},
               coalesce(sum(c.cached_tokens), 0) AS cached_tokens, sum(c.cost_usd) AS cost_usd,
               count(*) FILTER (WHERE {_UNPRICED}) AS unpriced_calls
          FROM {SCHEMA}.llm_calls c
          CROSS JOIN (VALUES ('minute'), ('hour')) AS b(bucket_size)
          LEFT JOIN {SCHEMA}.runs r ON r.run_id = c.run_id
         {where}
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
    """


def _replayability(*, unverified: bool) -> str:
    forged = (
        f"""WHEN EXISTS (SELECT 1 FROM {SCHEMA}.events e
                           WHERE e.run_id = r.run_id AND e.sequence = 1
                             AND e.unverified IS NOT NULL) THEN 'unverified'"""
        if unverified
        else ""
    )
    return f"""
        CREATE OR REPLACE VIEW {SCHEMA}.run_replayability WITH (security_invoker = true) AS
        SELECT r.run_id, r.tenant_id, r.agent_id, r.code_version, r.started_at,
               CASE
                 {forged}
                 WHEN NOT EXISTS (SELECT 1 FROM {SCHEMA}.events e
                                   WHERE e.run_id = r.run_id AND e.sequence = 1
                                     AND e.event_type = 'run.started')
                      OR r.event_count <> r.last_sequence THEN 'none'
                 WHEN r.limited_replay THEN 'control_flow_only'
                 WHEN r.unrecorded_calls > 0 THEN 'incomplete'
                 ELSE 'full'
               END AS replayability
          FROM {SCHEMA}.runs r
        """


def _recreate_llm_usage(*, verified_only: bool) -> None:
    op.execute(f"DROP VIEW {SCHEMA}.llm_usage")
    op.execute(_llm_usage(verified_only=verified_only))
    op.execute(f"GRANT SELECT ON {SCHEMA}.llm_usage TO blackbox_reader, blackbox_replayer")


def upgrade() -> None:
    """Add the marks, fill ``runs.finished_sequence``, count only unmarked calls."""
    op.add_column("events", sa.Column("unverified", sa.Text), schema=SCHEMA)
    op.create_index(
        "ix_events_unverified",
        "events",
        ["run_id", "sequence"],
        schema=SCHEMA,
        postgresql_where=sa.text("unverified IS NOT NULL"),
    )
    op.add_column("runs", sa.Column("finished_sequence", sa.BigInteger), schema=SCHEMA)
    op.execute(
        f"""
        UPDATE {SCHEMA}.runs r
           SET finished_sequence = (SELECT min(e.sequence) FROM {SCHEMA}.events e
                                     WHERE e.run_id = r.run_id
                                       AND e.event_type = 'run.finished')
         WHERE r.finished_at IS NOT NULL
        """
    )
    for table in ("llm_calls", "tool_calls"):
        op.add_column(table, sa.Column("unverified", sa.Text), schema=SCHEMA)
    _recreate_llm_usage(verified_only=True)
    op.execute(_replayability(unverified=True))


def downgrade() -> None:
    """Drop the marks; ``llm_usage`` and ``run_replayability`` as before."""
    op.execute(_replayability(unverified=False))
    _recreate_llm_usage(verified_only=False)
    for table in ("llm_calls", "tool_calls"):
        op.drop_column(table, "unverified", schema=SCHEMA)
    op.drop_column("runs", "finished_sequence", schema=SCHEMA)
    op.drop_index("ix_events_unverified", table_name="events", schema=SCHEMA)
    op.drop_column("events", "unverified", schema=SCHEMA)
