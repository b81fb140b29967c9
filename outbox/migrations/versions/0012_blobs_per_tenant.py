"""Bodies stored out of line belong to a tenant, and only its replayers read them.

Revision ID: 0012
Revises: 0011

``blackbox.blobs`` was content-addressed and nothing more: a replayer granted one tenant
could read any tenant's large bodies by their digest. Now:

- each row names its tenant, and the key is ``(digest, tenant_id)``: the same bytes
  stored by two tenants are two rows, so neither tenant's grant reaches the other's;
- replayers read bodies through ``read_blob(digest)``, which gives the copy of one of
  their granted tenants (the schema's owner, whose jobs back up and verify everything,
  reads any), and no longer select from the table: a plan over it would count the
  rows it hides. Row-level security on the table guards any other grant of it;
- ``store_blob(tenant, digest, data)`` stores for a tenant the calling writer is
  granted, still only under the digest of the bytes; the old two-argument function
  refuses every call, telling an agent of an older release to upgrade.

Rows stored before this revision have no known tenant: they get ``''``, which no grant
matches, and are readable by the owner only until ``blackbox migrate`` attributes each
to the tenants of the runs whose events name it. ``blob_tenancy_heads`` keeps each
run's head as this revision found it: only events that chain from the run's first event
to that head, read from the topic, may claim such a body (an event appended since could
name any digest its writer learned since; a forged copy is not on the chain).
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None

SCHEMA = "blackbox"
UNATTRIBUTED = ""
"""The tenant of a body stored before bodies had one (no grant reaches it)."""

_REFUSE = "USING ERRCODE = '42501'"


def upgrade() -> None:
    """Give every blob a tenant, guard reads with row security, and store per tenant."""
    op.execute(
        f"ALTER TABLE {SCHEMA}.blobs ADD COLUMN tenant_id text NOT NULL DEFAULT '{UNATTRIBUTED}'"
    )
    op.execute(f"ALTER TABLE {SCHEMA}.blobs ALTER COLUMN tenant_id DROP DEFAULT")
    op.execute(f"ALTER TABLE {SCHEMA}.blobs DROP CONSTRAINT blobs_pkey")
    # Digest first: reads and the backup's ordered scan look bodies up by digest.
    op.execute(f"ALTER TABLE {SCHEMA}.blobs ADD PRIMARY KEY (digest, tenant_id)")
    # Each run's head when bodies got tenants: only the events up to it, committed
    # before this revision, may give a body stored before then to their run's tenant
    # (see ``attribute_blobs_txn``). Kept only where there are such bodies.
    op.execute(
        f"""
        CREATE TABLE {SCHEMA}.blob_tenancy_heads (
            run_id text PRIMARY KEY,
            last_sequence bigint NOT NULL,
            chain_head text NOT NULL
        )
        """
    )
    op.execute(
        f"INSERT INTO {SCHEMA}.blob_tenancy_heads (run_id, last_sequence, chain_head) "
        f"SELECT r.run_id, r.last_sequence, r.chain_head FROM {SCHEMA}.runs r "
        f"WHERE EXISTS (SELECT 1 FROM {SCHEMA}.blobs)"
    )
    op.execute(f"REVOKE ALL ON {SCHEMA}.blob_tenancy_heads FROM PUBLIC")
    # Replayers read through read_blob, not the table: a plan of their own over it (an
    # EXPLAIN ANALYZE's "rows removed by filter") would count the rows security hides,
    # and so list other tenants' digests.
    op.execute(f"REVOKE SELECT ON {SCHEMA}.blobs FROM blackbox_replayer")
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.read_blob(p_digest text) RETURNS bytea
        LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            v_data bytea;
        BEGIN
            IF {SCHEMA}.owns_schema() THEN
                RETURN (SELECT b.data FROM {SCHEMA}.blobs b WHERE b.digest = p_digest LIMIT 1);
            END IF;
            SELECT b.data INTO v_data FROM {SCHEMA}.blobs b
             WHERE b.digest = p_digest AND b.tenant_id <> '{UNATTRIBUTED}'
               AND {SCHEMA}.granted_tenant(b.tenant_id)
             LIMIT 1;
            IF FOUND THEN
                RETURN v_data;
            END IF;
            -- Said only while no tenant has a copy: once one has, a login of another
            -- tenant learns nothing of the body from asking.
            IF EXISTS (SELECT 1 FROM {SCHEMA}.blobs b
                        WHERE b.digest = p_digest AND b.tenant_id = '{UNATTRIBUTED}')
               AND NOT EXISTS (SELECT 1 FROM {SCHEMA}.blobs b
                                WHERE b.digest = p_digest AND b.tenant_id <> '{UNATTRIBUTED}')
            THEN
                RAISE EXCEPTION 'body % was stored before bodies had tenants and is the '
                    'schema''s owner''s until `blackbox migrate` (run by the owner) gives it '
                    'to the tenant of the runs that name it', quote_literal(left(p_digest, 80))
                    {_REFUSE};
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.read_blob(text) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.read_blob(text) TO blackbox_replayer")
    granted = f"CAST((SELECT {SCHEMA}.granted_tenants()) AS text[])"
    op.execute(f"ALTER TABLE {SCHEMA}.blobs ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY blobs_of_granted_tenants ON {SCHEMA}.blobs FOR SELECT USING "
        f"(tenant_id <> '{UNATTRIBUTED}' "
        f"AND (tenant_id = ANY ({granted}) OR '*' = ANY ({granted})))"
    )
    # An agent of an older release still calls the two-argument function: it is told
    # what to do (upgrade the agent), not that a function is missing.
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION {SCHEMA}.store_blob(p_digest text, p_data bytea)
        RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            RAISE EXCEPTION 'this agent runs an agent-blackbox release older than the '
                'database (write-side revision 0012): it stores large bodies without their '
                'tenant, which the database no longer takes; upgrade agent-blackbox in the '
                'agent' USING ERRCODE = '0A000';
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.store_blob(p_tenant_id text, p_digest text, p_data bytea)
        RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            IF p_tenant_id IS NULL OR p_tenant_id = '{UNATTRIBUTED}'
               OR NOT {SCHEMA}.granted_tenant(p_tenant_id) THEN
                RAISE EXCEPTION 'this writer may not store bodies for tenant %',
                    quote_nullable(left(p_tenant_id, 200)) {_REFUSE};
            END IF;
            IF p_digest IS DISTINCT FROM 'sha256:' || encode(sha256(p_data), 'hex') THEN
                RAISE EXCEPTION 'blob % does not match the digest of its content',
                    quote_literal(left(p_digest, 80)) USING ERRCODE = '22023';
            END IF;
            INSERT INTO {SCHEMA}.blobs (digest, tenant_id, data, size)
            VALUES (p_digest, p_tenant_id, p_data, length(p_data))
            ON CONFLICT (digest, tenant_id) DO NOTHING;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.store_blob(text, text, bytea) FROM PUBLIC")
    op.execute(
        f"GRANT EXECUTE ON FUNCTION {SCHEMA}.store_blob(text, text, bytea) TO blackbox_writer"
    )


def downgrade() -> None:
    """Back to one row per digest, readable by every replayer."""
    op.execute(f"DROP FUNCTION {SCHEMA}.read_blob(text)")
    op.execute(f"DROP TABLE {SCHEMA}.blob_tenancy_heads")
    op.execute(f"GRANT SELECT ON {SCHEMA}.blobs TO blackbox_replayer")
    op.execute(f"DROP FUNCTION {SCHEMA}.store_blob(text, text, bytea)")
    op.execute(f"DROP FUNCTION {SCHEMA}.store_blob(text, bytea)")
    op.execute(f"DROP POLICY blobs_of_granted_tenants ON {SCHEMA}.blobs")
    op.execute(f"ALTER TABLE {SCHEMA}.blobs DISABLE ROW LEVEL SECURITY")
    op.execute(
        f"DELETE FROM {SCHEMA}.blobs b USING {SCHEMA}.blobs o "
        "WHERE o.digest = b.digest AND o.tenant_id < b.tenant_id"
    )
    op.execute(f"ALTER TABLE {SCHEMA}.blobs DROP CONSTRAINT blobs_pkey")
    op.execute(f"ALTER TABLE {SCHEMA}.blobs DROP COLUMN tenant_id")
    op.execute(f"ALTER TABLE {SCHEMA}.blobs ADD PRIMARY KEY (digest)")
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.store_blob(p_digest text, p_data bytea)
        RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            IF p_digest IS DISTINCT FROM 'sha256:' || encode(sha256(p_data), 'hex') THEN
                RAISE EXCEPTION 'blob % does not match the digest of its content',
                    quote_literal(left(p_digest, 80)) USING ERRCODE = '22023';
            END IF;
            INSERT INTO {SCHEMA}.blobs (digest, data, size)
            VALUES (p_digest, p_data, length(p_data))
            ON CONFLICT (digest) DO NOTHING;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.store_blob(text, bytea) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.store_blob(text, bytea) TO blackbox_writer")
