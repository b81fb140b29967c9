"""Indexes for the run list's filters, each in the list's order (newest start first).

Revision ID: 0014_views
Revises: 0013_views

On ``runs``: tenant, agent, status and code version. On ``run_rollups`` (which repeat a
run's tenant, agent, code version and start): the same identity columns, the prompt
version, and the start alone; a page filtered by what only the rollups hold (a model, a
prompt version, latency) is read from them. With these, a filtered page walks only the
runs that pass the indexed filter, in order, so a page costs about the same at a
million runs as at a thousand.
"""

from __future__ import annotations

from alembic import op

revision = "0014_views"
down_revision: str | None = "0013_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
ORDER = "started_at DESC NULLS LAST, run_id DESC"
INDEXES = {
    "runs": ("tenant_id", "agent_id", "status", "code_version"),
    "run_rollups": ("tenant_id", "agent_id", "code_version", "prompt_version", None),
}


def _name(table: str, column: str | None) -> str:
    return f"ix_{table}_{column or 'newest'}_started"


def upgrade() -> None:
    """Create one index per filter column, ordered as the list is."""
    op.execute(f"DROP INDEX IF EXISTS {SCHEMA}.ix_run_rollups_prompt")  # replaced below
    for table, columns in INDEXES.items():
        for column in columns:
            leading = f"{column}, " if column else ""
            op.execute(
                f"CREATE INDEX {_name(table, column)} ON {SCHEMA}.{table} ({leading}{ORDER})"
            )


def downgrade() -> None:
    """Drop them (and bring back revision 0012's prompt index)."""
    for table, columns in INDEXES.items():
        for column in columns:
            op.execute(f"DROP INDEX IF EXISTS {SCHEMA}.{_name(table, column)}")
    op.execute(
        f"CREATE INDEX ix_run_rollups_prompt ON {SCHEMA}.run_rollups (prompt_version, started_at)"
    )
