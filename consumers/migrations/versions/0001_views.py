"""Create the first views: runs, events, integrity_violations, consumer_offsets.

Revision ID: 0001_views
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_views"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the four tables and their indexes."""
    _create_runs()
    _create_events()
    _create_integrity_violations()
    _create_consumer_offsets()


def downgrade() -> None:
    """Drop the four tables (the schema itself stays)."""
    for table in ("consumer_offsets", "integrity_violations", "events", "runs"):
        op.drop_table(table, schema=SCHEMA)


def _create_runs() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'running'")),
        sa.Column("event_count", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("last_sequence", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("started_at", _TZ),
        sa.Column("finished_at", _TZ),
        sa.Column("last_event_at", _TZ, nullable=False),
        sa.Column("code_version", sa.Text),
        sa.Column("parent_run_id", sa.Text),
        sa.Column("updated_at", _TZ, nullable=False, server_default=sa.func.now()),
        schema=SCHEMA,
    )
    op.create_index("ix_runs_tenant_agent", "runs", ["tenant_id", "agent_id"], schema=SCHEMA)


def _create_events() -> None:
    op.create_table(
        "events",
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False, unique=True),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("body_version", sa.Integer, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("input_digest", sa.Text, nullable=False),
        sa.Column("output_digest", sa.Text, nullable=False),
        sa.Column("chain_hash", sa.Text, nullable=False),
        sa.Column("recorded_at", _TZ, nullable=False),
        sa.Column("key_id", sa.Text),
        sa.Column("payload_ref", sa.Text),
        sa.PrimaryKeyConstraint("run_id", "sequence"),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_events_topic_partition_offset",
        "events",
        ["topic", "partition", "offset"],
        schema=SCHEMA,
    )


def _create_integrity_violations() -> None:
    op.create_table(
        "integrity_violations",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("sequence", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("existing_input_digest", sa.Text, nullable=False),
        sa.Column("existing_output_digest", sa.Text, nullable=False),
        sa.Column("existing_chain_hash", sa.Text, nullable=False),
        sa.Column("incoming_input_digest", sa.Text, nullable=False),
        sa.Column("incoming_output_digest", sa.Text, nullable=False),
        sa.Column("incoming_chain_hash", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("detected_at", _TZ, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint(
            "run_id",
            "sequence",
            "event_id",
            "incoming_chain_hash",
            name="uq_integrity_violations_incoming",
        ),
        schema=SCHEMA,
    )


def _create_consumer_offsets() -> None:
    op.create_table(
        "consumer_offsets",
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("updated_at", _TZ, nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("group_id", "topic", "partition"),
        schema=SCHEMA,
    )
