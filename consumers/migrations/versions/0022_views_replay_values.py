"""Replay results are written through one checked function, and keep what their first
divergence was: a line for everyone, the values for a stated purpose.

Revision ID: 0022_views
Revises: 0021_views

- ``replay_results`` gains ``divergence_detail`` (the divergence in words: the boundary
  recorded and the one the code asked for, the paths that changed, the call site; never
  a value), ``divergence_values`` and ``values_key_id`` (the changed values and the input
  the code asked with, already scrubbed by the run's redaction rules: sealed under the
  run's data key when the run is sealed, so destroying its keys shreds them too; plain
  otherwise, and then cleared by ``forget``), ``values_kept`` (whether there are values to
  open) and ``recorded_by`` (the login that wrote the row).
- Readers may select every column but the values; replayers all of them (opening them
  writes an access audit row first, as opening a body does).
- ``record_replay_result()`` is the only way in: INSERT is revoked. It takes the run's
  tenant and agent from the runs view, refuses a run the caller's tenant grant does not
  cover (or the views do not know), derives ``passed`` from the result, and bounds what
  it keeps.
- ``runs`` gains an index of forks by their parent: a run page lists its forks, and
  without it that was a scan of every run (a quarter of a second at a million runs).
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text

revision = "0022_views"
down_revision: str | None = "0021_views"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox_views"
_READABLE = (
    "id, run_id, tenant_id, agent_id, recorded_code_version, code_version, result, passed, "
    "divergence_kind, divergence_sequence, events, duration_ms, replayed_at, "
    "divergence_detail, values_kept, recorded_by"
)
_CHECK = """
    IF NOT blackbox.granted_tenant(target.tenant_id) THEN
        RAISE EXCEPTION 'run % is not in a tenant this login is granted', p_run_id
            USING ERRCODE = '42501';
    END IF;
"""


def _function(check: str) -> str:
    return f"""
    CREATE FUNCTION {SCHEMA}.record_replay_result(
        p_run_id text, p_code_version text, p_result text, p_kind text, p_sequence bigint,
        p_events bigint, p_duration_ms double precision, p_detail text, p_values bytea,
        p_values_key_id text
    ) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE
        target record;
        kept bigint;
    BEGIN
        IF NOT pg_has_role(session_user, 'blackbox_replayer', 'MEMBER') THEN
            RAISE EXCEPTION 'only a replayer login records replay results'
                USING ERRCODE = '42501';
        END IF;
        IF p_result NOT IN ('PASS', 'LIMITED', 'DIVERGED', 'NONDETERMINISTIC', 'ERROR',
                            'SKIPPED') THEN
            RAISE EXCEPTION 'replay result % is not one a replay reports', p_result
                USING ERRCODE = '22023';
        END IF;
        IF (p_kind IS NULL) <> (p_sequence IS NULL) OR p_events < 0
           OR length(p_detail) > 4000 OR length(p_values) > 262144
           OR length(p_code_version) > 200 OR length(p_kind) > 64 THEN
            RAISE EXCEPTION 'replay result of run % is malformed or too large', p_run_id
                USING ERRCODE = '22023';
        END IF;
        SELECT r.tenant_id, r.agent_id, r.code_version INTO target
          FROM {SCHEMA}.runs r WHERE r.run_id = p_run_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'run % is not in the views', p_run_id USING ERRCODE = '42704';
        END IF;
        {check}
        INSERT INTO {SCHEMA}.replay_results
            (run_id, tenant_id, agent_id, recorded_code_version, code_version, result,
             passed, divergence_kind, divergence_sequence, events, duration_ms,
             divergence_detail, divergence_values, values_key_id, values_kept, recorded_by)
        VALUES (p_run_id, target.tenant_id, target.agent_id, target.code_version,
                p_code_version, p_result, p_result IN ('PASS', 'LIMITED'), p_kind,
                p_sequence, p_events, p_duration_ms, p_detail, p_values, p_values_key_id,
                p_values IS NOT NULL, session_user)
        RETURNING id INTO kept;
        RETURN kept;
    END
    $$
    """


def upgrade() -> None:
    """Add the columns, narrow the grants, create the function; index forks."""
    op.execute(
        f"CREATE INDEX ix_runs_forks ON {SCHEMA}.runs (parent_run_id, started_at) "
        "WHERE parent_run_id IS NOT NULL"
    )
    op.execute(
        f"ALTER TABLE {SCHEMA}.replay_results ADD COLUMN divergence_detail text, "
        "ADD COLUMN divergence_values bytea, ADD COLUMN values_key_id text, "
        "ADD COLUMN values_kept boolean NOT NULL DEFAULT false, ADD COLUMN recorded_by text"
    )
    op.execute(f"REVOKE SELECT, INSERT ON {SCHEMA}.replay_results FROM blackbox_reader")
    op.execute(f"REVOKE INSERT ON {SCHEMA}.replay_results FROM blackbox_replayer")
    op.execute(f"GRANT SELECT ({_READABLE}) ON {SCHEMA}.replay_results TO blackbox_reader")
    op.execute(f"GRANT SELECT ON {SCHEMA}.replay_results TO blackbox_replayer")
    # Without a write side there is no tenant grant to check (as revision 0009 says).
    scoped = op.get_bind().execute(text("SELECT to_regprocedure('blackbox.granted_tenants()')"))
    op.execute(_function(_CHECK if scoped.scalar() is not None else ""))
    name = f"{SCHEMA}.record_replay_result(text, text, text, text, bigint, bigint, " + (
        "double precision, text, bytea, text)"
    )
    op.execute(f"REVOKE ALL ON FUNCTION {name} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {name} TO blackbox_replayer")


def downgrade() -> None:
    """Drop the function, the columns and the index; give INSERT back."""
    op.execute(f"DROP INDEX {SCHEMA}.ix_runs_forks")
    op.execute(f"DROP FUNCTION {SCHEMA}.record_replay_result")
    op.execute(f"REVOKE SELECT ON {SCHEMA}.replay_results FROM blackbox_reader")
    op.execute(f"GRANT SELECT ON {SCHEMA}.replay_results TO blackbox_reader")
    op.execute(f"GRANT INSERT ON {SCHEMA}.replay_results TO blackbox_replayer")
    op.execute(
        f"ALTER TABLE {SCHEMA}.replay_results DROP COLUMN divergence_detail, "
        "DROP COLUMN divergence_values, DROP COLUMN values_key_id, DROP COLUMN values_kept, "
        "DROP COLUMN recorded_by"
    )
