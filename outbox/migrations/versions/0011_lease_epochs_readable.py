"""Readers may ask which lease epochs the write side granted.

Revision ID: 0011
Revises: 0010

Every reader of the topic fences a stale relay's copies by the lease epoch each message
carries in its ``blackbox.lease`` header (``agent_blackbox.broker``'s ``EpochFence``).
A header is whatever the producer wrote: anyone who may produce to the topic could
stamp a message with an epoch no relay was granted, and every reader would then drop
the shard's real events as stale. ``blackbox.lease_epochs()`` tells readers each shard's
newest granted epoch, so that an epoch past it moves no fence. The function reads
``relay_leases`` for them (SECURITY DEFINER): the epochs are all it gives, not the
owners or their expiry.
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox"
READERS = ("blackbox_reader", "blackbox_replayer", "blackbox_relay")


def upgrade() -> None:
    """Create the function and let the readers call it."""
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.lease_epochs() RETURNS TABLE (shard smallint, epoch bigint)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
            SELECT l.shard, l.epoch FROM {SCHEMA}.relay_leases l
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.lease_epochs() FROM PUBLIC")
    for role in READERS:
        op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.lease_epochs() TO {role}")


def downgrade() -> None:
    """Drop the function."""
    op.execute(f"DROP FUNCTION {SCHEMA}.lease_epochs()")
