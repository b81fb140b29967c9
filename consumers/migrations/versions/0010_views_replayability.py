"""How replayable each run is, as a view: ``full``, ``control_flow_only`` or ``none``.

Revision ID: 0010_views
Revises: 0009_views

- ``none``: the views do not hold the run whole (no ``run.started`` at sequence 1, or
  fewer events than its last sequence): there is no input snapshot to start from;
- ``control_flow_only``: its data keys were destroyed (the runs view's
  ``limited_replay``): replay checks control flow from the digests only;
- ``full``: everything.

A ``security_invoker`` view, so a reader sees the runs its grants let it see.
"""

from __future__ import annotations

from alembic import op

revision = "0010_views"
down_revision: str | None = "0009_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"


def upgrade() -> None:
    """Create the view and grant it to readers and replayers."""
    op.execute(
        f"""
        CREATE VIEW {SCHEMA}.run_replayability WITH (security_invoker = true) AS
        SELECT r.run_id, r.tenant_id, r.agent_id, r.code_version, r.started_at,
               CASE
                 WHEN NOT EXISTS (SELECT 1 FROM {SCHEMA}.events e
                                   WHERE e.run_id = r.run_id AND e.sequence = 1
                                     AND e.event_type = 'run.started')
                      OR r.event_count <> r.last_sequence THEN 'none'
                 WHEN r.limited_replay THEN 'control_flow_only'
                 ELSE 'full'
               END AS replayability
          FROM {SCHEMA}.runs r
        """
    )
    op.execute(f"GRANT SELECT ON {SCHEMA}.run_replayability TO blackbox_reader, blackbox_replayer")


def downgrade() -> None:
    """Drop the view."""
    op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.run_replayability")
