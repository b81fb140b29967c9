"""Lease epochs: a fencing number per shard that every claim raises.

Revision ID: 0006
Revises: 0005

``blackbox.relay_leases.epoch`` counts the claims of a shard: the relay that takes a
shard (from nobody, from a relay whose lease ran out, or back after its own lease ran
out) raises it by one in the claiming statement; renewing a lease that is still valid
keeps it. The relay stamps every message it publishes with its shard and this epoch
(``broker.LeaseStamp``), so a reader drops a copy that a relay paused past its lease
delivers after the next owner's newer messages. The relay role already updates
``relay_leases`` (revision 0003); the new column needs no new grant.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"


def upgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.relay_leases ADD COLUMN epoch bigint NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.relay_leases DROP COLUMN epoch")
