"""The database holds writers to the run id rule too.

Revision ID: 0010
Revises: 0009

The recorder refuses a run id outside the rule (``agent_blackbox.schemas.RUN_ID_RULE``:
1 to 128 characters of A-Z a-z 0-9 _ . : -, a letter or digit first), but a writer login
may call ``blackbox.start_run`` itself. A trigger on ``blackbox.runs`` refuses such an id
from any login that does not own the schema, so an agent host cannot plant markup or a
path as a run id by going around the recorder. The schema's owner still may: a restore
brings back runs recorded before the rule, whatever their ids.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox"
_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
"""``RUN_ID_PATTERN`` of ``agent_blackbox.schemas``, anchored, as Postgres writes it."""


def upgrade() -> None:
    """Create the check and its trigger."""
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.check_run_id() RETURNS trigger
        LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            IF NEW.run_id !~ '{_PATTERN}' AND NOT {SCHEMA}.owns_schema() THEN
                RAISE EXCEPTION 'run id % breaks the run id rule', quote_literal(NEW.run_id)
                    USING ERRCODE = '22023',
                    DETAIL = '1 to 128 characters of A-Z a-z 0-9 _ . : - starting with a '
                             'letter or a digit';
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        f"CREATE TRIGGER runs_run_id_rule BEFORE INSERT ON {SCHEMA}.runs "
        f"FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.check_run_id()"
    )


def downgrade() -> None:
    """Drop the trigger and its function."""
    op.execute(f"DROP TRIGGER runs_run_id_rule ON {SCHEMA}.runs")
    op.execute(f"DROP FUNCTION {SCHEMA}.check_run_id()")
