"""Datasets and experiments: named sets of recorded runs, and experiments that fork
them with a variant and keep each run's scores.

Revision ID: 0020_views
Revises: 0019_views

- ``datasets`` (one row per named set: how it was selected, the tenants of its runs)
  and ``dataset_runs`` (its runs, in order).
- ``experiments`` (one row per experiment: what it ran on, the variant, the evaluators,
  the confidence level and tolerances its summary uses, its state), ``experiment_runs``
  (one row per recorded run it covered: the fork made of it and how that went; why a
  run was not scored only by the kind of failure, since an agent's or an evaluator's
  own message may quote what it read) and
  ``experiment_scores`` (one row per run and score: the recorded run's score and the
  fork's). No body is kept: scores are numbers, and a change to a prompt is kept as its
  digest.

Written by ``blackbox experiment`` and ``blackbox dataset`` as the replayer role, read
by readers and replayers. A run's rows carry its tenant and are scoped by it; a dataset
or an experiment is seen only by a role granted every tenant it covers, so a summary is
never drawn from runs its reader may not see.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0020_views"
down_revision: str | None = "0019_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_GRANTED = "CAST((SELECT blackbox.granted_tenants()) AS text[])"
_MINE = f"(tenant_id = ANY ({_GRANTED}) OR '*' = ANY ({_GRANTED}))"
_ALL_MINE = f"(tenants <@ {_GRANTED} OR '*' = ANY ({_GRANTED}))"

_SETS = ("datasets", "experiments")
_RUN_ROWS = ("dataset_runs", "experiment_runs", "experiment_scores")
_WRITES = {
    "datasets": "INSERT, DELETE",
    "dataset_runs": "INSERT, DELETE",
    "experiments": "INSERT, UPDATE",
    "experiment_runs": "INSERT",
    "experiment_scores": "INSERT",
}


def _created() -> list[sa.Column[object]]:
    return [
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("created_by", sa.Text, nullable=False, server_default=sa.text("current_user")),
    ]


def _datasets() -> None:
    op.create_table(
        "datasets",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("description", sa.Text),
        sa.Column("selection", JSONB, nullable=False),
        sa.Column("tenants", ARRAY(sa.Text), nullable=False),
        sa.Column("runs", sa.Integer, nullable=False),
        *_created(),
        schema=SCHEMA,
    )
    op.create_table(
        "dataset_runs",
        sa.Column(
            "dataset",
            sa.Text,
            sa.ForeignKey(f"{SCHEMA}.datasets.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("dataset", "run_id"),
        schema=SCHEMA,
    )


def _experiments() -> None:
    op.create_table(
        "experiments",
        sa.Column("experiment_id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("dataset", sa.Text),
        sa.Column("selection", JSONB, nullable=False),
        sa.Column("variant", JSONB, nullable=False),
        sa.Column("evaluators", ARRAY(sa.Text), nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("tolerances", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("tenants", ARRAY(sa.Text), nullable=False),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'running'")),
        *_created(),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_experiments_newest", "experiments", [sa.text("created_at DESC")], schema=SCHEMA
    )
    owner = sa.ForeignKey(f"{SCHEMA}.experiments.experiment_id", ondelete="CASCADE")
    op.create_table(
        "experiment_runs",
        sa.Column("experiment_id", sa.Text, owner, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("fork_run_id", sa.Text),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("fork_status", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column(
            "scored_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("experiment_id", "run_id"),
        schema=SCHEMA,
    )
    op.create_index("ix_experiment_runs_fork", "experiment_runs", ["fork_run_id"], schema=SCHEMA)
    op.create_table(
        "experiment_scores",
        sa.Column("experiment_id", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("score", sa.Text, nullable=False),
        sa.Column("evaluator", sa.Text, nullable=False),
        sa.Column("lower_is_better", sa.Boolean, nullable=False),
        sa.Column("baseline", sa.Float),
        sa.Column("variant", sa.Float),
        sa.PrimaryKeyConstraint("experiment_id", "run_id", "score"),
        sa.ForeignKeyConstraint(
            ["experiment_id", "run_id"],
            [f"{SCHEMA}.experiment_runs.experiment_id", f"{SCHEMA}.experiment_runs.run_id"],
            ondelete="CASCADE",
        ),
        schema=SCHEMA,
    )


def _secure() -> None:
    for table in (*_SETS, *_RUN_ROWS):
        op.execute(f"GRANT SELECT ON {SCHEMA}.{table} TO blackbox_reader, blackbox_replayer")
        op.execute(f"GRANT {_WRITES[table]} ON {SCHEMA}.{table} TO blackbox_replayer")
    found = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    if found.scalar() is None:
        return  # no write side here: nothing to scope by (as revision 0006 says)
    for table in (*_SETS, *_RUN_ROWS):
        mine = _ALL_MINE if table in _SETS else _MINE
        op.execute(f"ALTER TABLE {SCHEMA}.{table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {table}_read ON {SCHEMA}.{table} FOR SELECT USING ({mine})")
        op.execute(
            f"CREATE POLICY {table}_written ON {SCHEMA}.{table} FOR INSERT WITH CHECK ({mine})"
        )
        if "UPDATE" in _WRITES[table]:
            op.execute(
                f"CREATE POLICY {table}_updated ON {SCHEMA}.{table} FOR UPDATE "
                f"USING ({mine}) WITH CHECK ({mine})"
            )
        if "DELETE" in _WRITES[table]:
            op.execute(
                f"CREATE POLICY {table}_deleted ON {SCHEMA}.{table} FOR DELETE USING ({mine})"
            )


def upgrade() -> None:
    """Create the tables, their grants and their row security."""
    _datasets()
    _experiments()
    _secure()


def downgrade() -> None:
    """Drop the tables."""
    for table in ("experiment_scores", "experiment_runs", "experiments"):
        op.drop_table(table, schema=SCHEMA)
    for table in ("dataset_runs", "datasets"):
        op.drop_table(table, schema=SCHEMA)
