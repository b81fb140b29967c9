"""Write side: runs, outbox, blobs, effects, relay leases and members, outbox notification.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA = "blackbox"


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("subject_ids", postgresql.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("last_sequence", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("chain_head", sa.Text, nullable=False),
        sa.Column("parent_run_id", sa.Text),
        sa.Column("code_version", sa.Text),
        sa.Column("state", sa.Text),
        sa.Column("classification", sa.Text, nullable=False, server_default="internal"),
        sa.Column("retention_class", sa.Text, nullable=False, server_default="standard"),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("shard", sa.SmallInteger, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("event_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("envelope", sa.LargeBinary, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_index("outbox_shard_id", "outbox", ["shard", "id"], schema=SCHEMA)
    # The outbox is a queue: every row is deleted soon after it is written. Vacuum it
    # early and often, in small steps, so dead rows do not slow the relay's reads.
    op.execute(
        f"ALTER TABLE {SCHEMA}.outbox SET (autovacuum_vacuum_scale_factor = 0, "
        "autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0, "
        "autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000)"
    )
    op.create_table(
        "blobs",
        sa.Column("digest", sa.Text, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_table(
        "relay_leases",
        sa.Column("shard", sa.SmallInteger, primary_key=True),
        sa.Column("owner", sa.Text),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
        schema=SCHEMA,
    )
    # Side effects whose receipt is outstanding are found here after a crash; rows are
    # written in the transactions of the intent and of the receipt.
    op.create_table(
        "effects",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("idempotency_key", sa.Text, primary_key=True),
        sa.Column("effect", sa.Text, nullable=False),
        sa.Column("intent_sequence", sa.BigInteger, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("external_id", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_index(
        "effects_unresolved",
        "effects",
        ["created_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("status IN ('pending', 'unknown')"),
    )
    # Live relays heartbeat here, so each can take its fair share of the shards.
    op.create_table(
        "relay_members",
        sa.Column("owner", sa.Text, primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        schema=SCHEMA,
    )
    # One notification per inserting statement wakes idle relays; Postgres folds
    # duplicates within a transaction, so a busy writer pays for it once per commit.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('blackbox_outbox', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER outbox_notify AFTER INSERT ON {SCHEMA}.outbox
        FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.notify_outbox()
        """
    )


def downgrade() -> None:
    op.execute(f"DROP TRIGGER IF EXISTS outbox_notify ON {SCHEMA}.outbox")
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.notify_outbox()")
    for table in ("effects", "relay_members", "relay_leases", "blobs", "outbox", "runs"):
        op.drop_table(table, schema=SCHEMA)
