"""Sessions, users and search.

Revision ID: 0019_views
Revises: 0018_views

- ``runs`` gains ``session_id`` and ``user_id`` (from ``run.started``; cleared when the
  run is shredded or forgotten), each indexed in the run list's order.
- ``run_rollups`` gains what the run list's search finds a run by: ``tools`` (the tools
  it called), ``error_classes`` (the classes of the errors it and its calls failed
  with) and ``words`` (the words of its LLM messages, for tenants that opted in,
  without positions), each GIN-indexed in the one table, so that several search terms
  intersect as bitmaps of one index scan each; ``runs.run_id`` is indexed in byte
  order for run id prefixes, and the rollups' tags get a GIN index.
- Full-text search over the redacted text of LLM messages, for the tenants that opt
  in: ``text_search_tenants`` (the opt-ins) and ``message_text`` (one ``tsvector`` per
  ``llm.call``, GIN-indexed; never the text). Both are scoped by tenant like every
  other view, so a reader finds only its granted tenants' words.

Rollups made before this revision have no tools, error classes or words (a rebuild of
the analytics views from offset zero fills them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import ARRAY, TSVECTOR

revision = "0019_views"
down_revision: str | None = "0018_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
ORDER = "started_at DESC NULLS LAST, run_id DESC"
_GRANTED = "CAST((SELECT blackbox.granted_tenants()) AS text[])"
_MINE = f"(tenant_id = ANY ({_GRANTED}) OR '*' = ANY ({_GRANTED}))"
ROLES = "blackbox_reader, blackbox_replayer"
LABELS = ("session_id", "user_id")
FACETS = ("tools", "error_classes")
INDEXES = {
    "ix_runs_session_id_started": f"runs (session_id, {ORDER}) WHERE session_id IS NOT NULL",
    "ix_runs_user_id_started": f"runs (user_id, {ORDER}) WHERE user_id IS NOT NULL",
    "ix_runs_run_id_bytes": 'runs (run_id COLLATE "C")',
    "ix_run_rollups_tags": "run_rollups USING gin (tags jsonb_path_ops)",
    "ix_run_rollups_tools": "run_rollups USING gin (tools)",
    "ix_run_rollups_error_classes": "run_rollups USING gin (error_classes)",
    "ix_run_rollups_words": "run_rollups USING gin (words)",
}


def upgrade() -> None:
    """Add the run and rollup columns, the search indexes and the full-text tables."""
    for name in LABELS:
        op.add_column("runs", sa.Column(name, sa.Text), schema=SCHEMA)
    for name in FACETS:
        empty = sa.text("'{}'")
        column: sa.Column[list[str]] = sa.Column(
            name, ARRAY(sa.Text), nullable=False, server_default=empty
        )
        op.add_column("run_rollups", column, schema=SCHEMA)
    op.add_column("run_rollups", sa.Column("words", TSVECTOR), schema=SCHEMA)
    for name, target in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON {SCHEMA}.{target}")
    op.create_table(
        "text_search_tenants",
        sa.Column("tenant_id", sa.Text, primary_key=True),
        sa.Column(
            "enabled_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("enabled_by", sa.Text, nullable=False, server_default=sa.text("session_user")),
        schema=SCHEMA,
    )
    op.create_table(
        "message_text",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("sequence", sa.BigInteger, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("words", TSVECTOR, nullable=False),
        schema=SCHEMA,
    )
    op.execute(f"CREATE INDEX ix_message_text_words ON {SCHEMA}.message_text USING gin (words)")
    op.execute(f"GRANT SELECT ON {SCHEMA}.message_text, {SCHEMA}.text_search_tenants TO {ROLES}")
    found = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    if found.scalar() is None:
        return  # no write side here: nothing to scope by (as revision 0006 says)
    for table in ("message_text", "text_search_tenants"):
        op.execute(f"ALTER TABLE {SCHEMA}.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY {table}_of_granted_tenants ON {SCHEMA}.{table} "
            f"FOR SELECT USING ({_MINE})"
        )


def downgrade() -> None:
    """Drop the full-text tables, the indexes and the columns."""
    op.drop_table("message_text", schema=SCHEMA)
    op.drop_table("text_search_tenants", schema=SCHEMA)
    for name in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {SCHEMA}.{name}")
    for name in (*FACETS, "words"):
        op.drop_column("run_rollups", name, schema=SCHEMA)
    for name in LABELS:
        op.drop_column("runs", name, schema=SCHEMA)
