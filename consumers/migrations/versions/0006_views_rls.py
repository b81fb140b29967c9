"""Row-level security on the views: readers and replayers see their granted tenants' runs.

Revision ID: 0006_views
Revises: 0005_views

The grants are the write side's (``blackbox.tenant_grants``, asked through
``blackbox.granted_tenants()``); where the views live in a database without the write
side, there is nothing to scope by and the views stay as they were (a warning says so).
The view consumer and the signer's tables are written by the schema's owner, which row
security does not restrict.
"""

from __future__ import annotations

import logging

from alembic import op
from sqlalchemy import text

revision = "0006_views"
down_revision: str | None = "0005_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_GRANTED = "CAST((SELECT blackbox.granted_tenants()) AS text[])"
_MINE = f"(tenant_id = ANY ({_GRANTED}) OR '*' = ANY ({_GRANTED}))"
_OF_MY_RUN = f"EXISTS (SELECT 1 FROM {SCHEMA}.runs r WHERE r.run_id = {{table}}.run_id)"
POLICIES = {
    "runs": _MINE,
    "checkpoints": _MINE,
    "events": _OF_MY_RUN.format(table="events"),
    "integrity_violations": _OF_MY_RUN.format(table="integrity_violations"),
}


def upgrade() -> None:
    """Enable row security with one read policy per table the readers may read."""
    found = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    if found.scalar() is None:
        logging.getLogger(__name__).warning(
            "the write side is not in this database: the views are not scoped by tenant"
        )
        return
    for table, rule in POLICIES.items():
        op.execute(f"ALTER TABLE {SCHEMA}.{table} ENABLE ROW LEVEL SECURITY")
        policy = f"{table}_of_granted_tenants"
        op.execute(f"CREATE POLICY {policy} ON {SCHEMA}.{table} FOR SELECT USING ({rule})")


def downgrade() -> None:
    """Drop the policies and row security."""
    for table in POLICIES:
        op.execute(f"DROP POLICY IF EXISTS {table}_of_granted_tenants ON {SCHEMA}.{table}")
        op.execute(f"ALTER TABLE {SCHEMA}.{table} DISABLE ROW LEVEL SECURITY")
