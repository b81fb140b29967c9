"""The relay may refresh the outbox's planner statistics.

Revision ID: 0008
Revises: 0007

A queue is vacuumed when it is nearly empty, so its statistics usually say it is empty.
When a burst fills it (a backlog after a broker outage, a bulk import), the planner goes
on believing that until the next automatic ANALYZE (up to ``autovacuum_naptime`` away, a
minute by default) and plans the relay's statements for a table of a few rows: with
those statistics, a delete of a 5,000-row batch was once planned as a walk of the (shard,
id) index for each id, 2-7 s a batch instead of 10-20 ms. The relay's delete is written
so that only the primary key can serve it; fresh statistics keep the planner's other
choices right for the backlog as it is.

``blackbox.analyze_outbox()`` runs ``ANALYZE`` on the outbox as its owner, skipping it
when another ANALYZE or a VACUUM holds the table; the relay (``blackbox_relay``, who does
not own the table) calls it when it reads a full batch, at most once a minute.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"
ROLE = "blackbox_relay"


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.analyze_outbox() RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            ANALYZE (SKIP_LOCKED) {SCHEMA}.outbox;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.analyze_outbox() FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.analyze_outbox() TO {ROLE}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SCHEMA}.analyze_outbox()")
