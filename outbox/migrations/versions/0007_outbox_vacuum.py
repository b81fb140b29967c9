"""The outbox is a queue: vacuum it by row count, not by table size.

Revision ID: 0007
Revises: 0006

Every outbox row is inserted once and deleted once, so the table stays small while its
dead rows pile up at the rate events flow. The relay reads the oldest live rows in id
order; dead index entries ahead of them make every read walk further (measured: a relay
at 7k events/s over a freshly churned outbox, 18.8k after a VACUUM). The default
autovacuum trigger, a fifth of the table's size, never fires on a table that is nearly
empty; these settings vacuum it after a fixed number of dead rows, without the cost
delay that would let it fall behind.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"


def upgrade() -> None:
    op.execute(
        f"ALTER TABLE {SCHEMA}.outbox SET ("
        "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000, "
        "autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000, "
        "autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0, "
        "autovacuum_analyze_threshold = 10000)"
    )


def downgrade() -> None:
    op.execute(
        f"ALTER TABLE {SCHEMA}.outbox RESET ("
        "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
        "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, "
        "autovacuum_vacuum_cost_delay, autovacuum_analyze_scale_factor, "
        "autovacuum_analyze_threshold)"
    )
