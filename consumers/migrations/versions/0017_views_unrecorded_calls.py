"""Runs name the calls that left them unrecorded.

Revision ID: 0017_views
Revises: 0016_views

``runs.unrecorded_calls``: how many calls the run's code made through no boundary (a
connection of a client the run did not record), from ``run.finished``'s unsealed
``unrecorded_calls`` attribute; ``runs.unrecorded_call`` describes the first (host,
port and the agent's line). Null for runs that had none, or have not finished.

``run_replayability`` says ``incomplete`` for such a run: its log lacks what those calls
answered, so a replay refuses them (an ``unrecorded_call`` divergence).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_views"
down_revision: str | None = "0016_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def _replayability(incomplete: bool) -> str:
    holes = "WHEN r.unrecorded_calls > 0 THEN 'incomplete'" if incomplete else ""
    return f"""
        CREATE OR REPLACE VIEW {SCHEMA}.run_replayability WITH (security_invoker = true) AS
        SELECT r.run_id, r.tenant_id, r.agent_id, r.code_version, r.started_at,
               CASE
                 WHEN NOT EXISTS (SELECT 1 FROM {SCHEMA}.events e
                                   WHERE e.run_id = r.run_id AND e.sequence = 1
                                     AND e.event_type = 'run.started')
                      OR r.event_count <> r.last_sequence THEN 'none'
                 WHEN r.limited_replay THEN 'control_flow_only'
                 {holes}
                 ELSE 'full'
               END AS replayability
          FROM {SCHEMA}.runs r
        """


def upgrade() -> None:
    """Add ``runs.unrecorded_calls`` and ``runs.unrecorded_call``; replayability says
    ``incomplete`` for runs that had some."""
    op.add_column("runs", sa.Column("unrecorded_calls", sa.Integer), schema=SCHEMA)
    op.add_column("runs", sa.Column("unrecorded_call", sa.Text), schema=SCHEMA)
    op.execute(_replayability(incomplete=True))


def downgrade() -> None:
    """Drop them, and the ``incomplete`` level."""
    op.execute(_replayability(incomplete=False))
    op.drop_column("runs", "unrecorded_call", schema=SCHEMA)
    op.drop_column("runs", "unrecorded_calls", schema=SCHEMA)
