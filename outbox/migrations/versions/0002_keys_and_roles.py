"""Data keys, tenant digest keys, the access audit, the deletion ledger, and the roles.

Revision ID: 0002
Revises: 0001

Roles (NOLOGIN group roles; grant them to login users):

- ``blackbox_writer`` (agents): creates runs, appends events, stores blobs and wrapped
  data keys; reads no key and no other run's bodies back.
- ``blackbox_reader`` (views, dashboards): run metadata and the read side's views; no
  outbox, no blobs, no key material.
- ``blackbox_replayer``: what the reader may, plus blobs (sealed) and
  ``blackbox.unwrap_data_key``, which writes an access-audit row on every call.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"
ROLES = ("blackbox_writer", "blackbox_reader", "blackbox_replayer")


def upgrade() -> None:
    op.create_table(
        "data_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("kek_version", sa.Text, nullable=False),
        # NULL once destroyed: the ciphertexts it sealed can never be opened again.
        sa.Column("wrapped", sa.LargeBinary),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("destroyed_at", sa.DateTime(timezone=True)),
        sa.Column("destroyed_reason", sa.Text),
        schema=SCHEMA,
    )
    op.create_index("data_keys_run", "data_keys", ["run_id"], schema=SCHEMA)
    # One digest key per tenant: the HMAC key of sensitive runs' input and output digests.
    op.create_table(
        "tenant_keys",
        sa.Column("tenant_id", sa.Text, primary_key=True),
        sa.Column("kek_version", sa.Text, nullable=False),
        sa.Column("wrapped", sa.LargeBinary, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_table(
        "access_audit",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("purpose", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text),
        sa.Column("tenant_id", sa.Text),
        sa.Column("key_id", sa.Text),
        sa.Column("outcome", sa.Text, nullable=False),
        schema=SCHEMA,
    )
    op.create_index("access_audit_run", "access_audit", ["run_id", "at"], schema=SCHEMA)
    op.create_table(
        "deletion_ledger",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("key_ids", postgresql.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("subject_id", sa.Text),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        schema=SCHEMA,
    )
    op.create_index("deletion_ledger_run", "deletion_ledger", ["run_id"], schema=SCHEMA)
    _unwrap_function()
    _roles()


def _unwrap_function() -> None:
    # SECURITY DEFINER: the caller reads data_keys only through this function, and the
    # audit row is written in the same statement. RAISE LOG also puts every call in the
    # server log, which a caller cannot roll back along with its transaction.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.unwrap_data_key(p_run_id text, p_key_id text, p_purpose text)
        RETURNS TABLE (key_id text, kek_version text, wrapped bytea, destroyed_at timestamptz)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            found record;
        BEGIN
            IF p_purpose IS NULL OR length(btrim(p_purpose)) < 3 THEN
                RAISE EXCEPTION 'a purpose is required to unwrap data keys'
                    USING ERRCODE = '22023';
            END IF;
            SELECT k.key_id, k.kek_version, k.wrapped, k.destroyed_at INTO found
              FROM {SCHEMA}.data_keys k
             WHERE k.run_id = p_run_id AND k.key_id = p_key_id;
            INSERT INTO {SCHEMA}.access_audit (principal, purpose, run_id, key_id, outcome)
            VALUES (session_user, p_purpose, p_run_id, p_key_id,
                    CASE WHEN found.key_id IS NULL THEN 'missing'
                         WHEN found.wrapped IS NULL THEN 'destroyed'
                         ELSE 'granted' END);
            RAISE LOG 'blackbox unwrap: principal=% purpose=% run=% key=%',
                session_user, p_purpose, p_run_id, p_key_id;
            IF found.key_id IS NOT NULL THEN
                key_id := found.key_id;
                kek_version := found.kek_version;
                wrapped := found.wrapped;
                destroyed_at := found.destroyed_at;
                RETURN NEXT;
            END IF;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.unwrap_data_key(text, text, text) FROM PUBLIC")
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.unwrap_tenant_key(p_tenant_id text, p_purpose text)
        RETURNS TABLE (kek_version text, wrapped bytea)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            IF p_purpose IS NULL OR length(btrim(p_purpose)) < 3 THEN
                RAISE EXCEPTION 'a purpose is required to unwrap digest keys'
                    USING ERRCODE = '22023';
            END IF;
            INSERT INTO {SCHEMA}.access_audit (principal, purpose, tenant_id, outcome)
            VALUES (session_user, p_purpose, p_tenant_id, 'digest key');
            RAISE LOG 'blackbox unwrap: principal=% purpose=% tenant digest key=%',
                session_user, p_purpose, p_tenant_id;
            RETURN QUERY SELECT t.kek_version, t.wrapped FROM {SCHEMA}.tenant_keys t
                          WHERE t.tenant_id = p_tenant_id;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.unwrap_tenant_key(text, text) FROM PUBLIC")


def _roles() -> None:
    # Roles belong to the cluster, not the database: create them only where missing.
    for role in ROLES:
        op.execute(
            f"""
            DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                    CREATE ROLE {role} NOLOGIN;
                END IF;
            END $$
            """
        )
    for role in ROLES:
        op.execute(f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}")
    writer = "blackbox_writer"
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {SCHEMA}.runs TO {writer}")
    op.execute(f"GRANT INSERT ON {SCHEMA}.outbox, {SCHEMA}.blobs, {SCHEMA}.data_keys TO {writer}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {SCHEMA}.effects TO {writer}")
    # Agents take keyed digests themselves, so they read their tenant's wrapped key.
    op.execute(f"GRANT SELECT, INSERT ON {SCHEMA}.tenant_keys TO {writer}")
    for role in ("blackbox_reader", "blackbox_replayer"):
        op.execute(f"GRANT SELECT ON {SCHEMA}.runs TO {role}")
    op.execute(f"GRANT SELECT ON {SCHEMA}.blobs TO blackbox_replayer")
    op.execute(
        f"GRANT EXECUTE ON FUNCTION {SCHEMA}.unwrap_data_key(text, text, text) TO blackbox_replayer"
    )
    op.execute(
        f"GRANT EXECUTE ON FUNCTION {SCHEMA}.unwrap_tenant_key(text, text) TO blackbox_replayer"
    )


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.unwrap_data_key(text, text, text)")
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.unwrap_tenant_key(text, text)")
    for table in ("deletion_ledger", "access_audit", "tenant_keys", "data_keys"):
        op.drop_table(table, schema=SCHEMA)
    for role in ROLES:
        op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM {role}")
        op.execute(f"REVOKE USAGE ON SCHEMA {SCHEMA} FROM {role}")
