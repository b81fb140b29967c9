"""Scoped writers: tenants per role, a writer credential per run, appends only through
functions, row-level security.

Revision ID: 0004
Revises: 0003

- ``blackbox.tenant_grants`` names, for a role (a login user or a group it belongs to),
  the tenants it may act for (``*`` is every tenant). ``granted_tenant(t)`` answers for
  the session's user; the schema's owner and superusers always may.
- ``blackbox.run_writers`` keeps, per run, the SHA-256 of the writer credential: a
  random secret the recorder makes at ``start_run`` (or at a take-over) and never stores.
- The writer role loses INSERT and UPDATE on ``runs``, ``outbox``, ``effects``,
  ``data_keys`` and ``blobs``. It writes only through SECURITY DEFINER functions with a pinned
  ``search_path``: ``start_run`` (tenant granted), ``store_data_key``, ``store_blob``
  (content-addressed: only under the digest of its bytes), ``append_event``
  (credential, status ``running``, the run's own data key when it has one: a
  sealed run refuses a plaintext body) and ``take_over_run`` (a new writer for a crashed
  run of a granted tenant; the old credential stops working).
- Row-level security on ``runs`` and ``effects``: writers, readers and replayers see the
  rows of their granted tenants only. Jobs that run as the schema's owner (migrations,
  retention, the views consumer) are not subject to it.

Refusals use SQLSTATE 42501 (insufficient_privilege); appending to a run that is not
running, 55000 (object_not_in_prerequisite_state).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"


def upgrade() -> None:
    op.create_table(
        "tenant_grants",
        sa.Column("role_name", sa.Text, primary_key=True),
        sa.Column("tenant_id", sa.Text, primary_key=True),
        # The role itself: a role dropped and created again under the same name is
        # another role, and does not inherit the grants.
        sa.Column("role_oid", postgresql.OID, nullable=False),
        sa.Column(
            "granted_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    # SECURITY DEFINER: callers may not read the grants table, only ask about themselves.
    # session_user, not current_user: inside a definer function current_user is the owner.
    # Roles are matched by oid through a join, so a grant to a role that was dropped (or
    # never existed) is simply not one of the session's, never an error.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.owns_schema() RETURNS boolean
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
            SELECT EXISTS (SELECT 1 FROM pg_roles r
                            WHERE r.rolname = session_user AND r.rolsuper)
                OR EXISTS (SELECT 1 FROM pg_namespace n
                            WHERE n.nspname = '{SCHEMA}'
                              AND pg_has_role(session_user, n.nspowner, 'MEMBER'))
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.granted_tenants() RETURNS text[]
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
            SELECT coalesce(array_agg(DISTINCT g.tenant_id), '{{}}')
              FROM {SCHEMA}.tenant_grants g
              JOIN pg_roles r ON r.oid = g.role_oid AND r.rolname = g.role_name
             WHERE pg_has_role(session_user, r.oid, 'MEMBER')
        $$
        """
    )
    # The policies call granted_tenants() once per statement (a scalar subquery in a
    # policy is an InitPlan), rather than a function call per row of a large scan.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.granted_tenant(p_tenant_id text) RETURNS boolean
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
            SELECT p_tenant_id = ANY ({SCHEMA}.granted_tenants())
                OR '*' = ANY ({SCHEMA}.granted_tenants())
                OR {SCHEMA}.owns_schema()
        $$
        """
    )
    op.create_table(
        "run_writers",
        sa.Column(
            "run_id",
            sa.Text,
            sa.ForeignKey(f"{SCHEMA}.runs.run_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("credential_hash", sa.LargeBinary, nullable=False),
        sa.Column("writer", sa.Text, nullable=False),
        sa.Column(
            "since", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    for statement in _FUNCTIONS:
        op.execute(statement)
    _scope_roles()


def _scope_roles() -> None:
    writer = "blackbox_writer"
    op.execute(f"REVOKE INSERT, UPDATE ON {SCHEMA}.runs, {SCHEMA}.effects FROM {writer}")
    op.execute(
        f"REVOKE INSERT ON {SCHEMA}.outbox, {SCHEMA}.data_keys, {SCHEMA}.blobs FROM {writer}"
    )
    for signature, roles in _GRANTS.items():
        op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.{signature} FROM PUBLIC")
        for role in roles:
            op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{signature} TO {role}")
    granted = f"CAST((SELECT {SCHEMA}.granted_tenants()) AS text[])"
    mine = f"tenant_id = ANY ({granted}) OR '*' = ANY ({granted})"
    op.execute(f"ALTER TABLE {SCHEMA}.runs ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY runs_of_granted_tenants ON {SCHEMA}.runs FOR SELECT USING ({mine})")
    op.execute(f"ALTER TABLE {SCHEMA}.effects ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY effects_of_granted_tenants ON {SCHEMA}.effects FOR SELECT USING "
        f"(EXISTS (SELECT 1 FROM {SCHEMA}.runs r WHERE r.run_id = effects.run_id))"
    )


_ALL_ROLES = ("blackbox_writer", "blackbox_reader", "blackbox_replayer", "blackbox_relay")
_GRANTS = {
    "owns_schema()": _ALL_ROLES,
    "granted_tenant(text)": _ALL_ROLES,
    "granted_tenants()": _ALL_ROLES,
    "start_run(text, text, text, text[], text, text, text, text, text, bytea)": (
        "blackbox_writer",
    ),
    "store_data_key(text, bytea, text, text, text, bytea)": ("blackbox_writer",),
    "store_blob(text, bytea)": ("blackbox_writer",),
    "take_over_run(text, bytea)": ("blackbox_writer",),
    "append_event(text, bytea, smallint, bigint, text, text, text, uuid, bytea, text, text, "
    "text, text, text, text, integer, bigint)": ("blackbox_writer",),
    "avro_head(text, text[])": (),
}

_REFUSE = "USING ERRCODE = '42501'"

TAKE_OVER_AFTER_S = 600
"""How long a run must have been quiet before another login may take it over."""

_FUNCTIONS = [
    # The first fields of an envelope's Avro record, as append_event expects them: each
    # of ``p_fields`` is a string (``s`` in ``p_kinds``: its UTF-8 length, then the bytes)
    # or a long (``l``), every length and long in Avro's zigzag varint (7 bits a byte,
    # low first). One PL/pgSQL call without a SET clause: a call per field, or a SET,
    # cost several times the encoding (it uses built-ins only, on append_event's pinned
    # search_path).
    f"""
    CREATE FUNCTION {SCHEMA}.avro_head(p_kinds text, p_fields text[]) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        v_out bytea := ''::bytea;
        v_bytes bytea;
        v_rest bigint;
    BEGIN
        FOR i IN 1 .. pg_catalog.length(p_kinds) LOOP
            IF pg_catalog.substr(p_kinds, i, 1) = 's' THEN
                v_bytes := pg_catalog.convert_to(p_fields[i], 'UTF8');
                v_rest := pg_catalog.length(v_bytes);
            ELSE
                v_bytes := ''::bytea;
                v_rest := p_fields[i]::bigint;
            END IF;
            v_rest := (v_rest << 1) # (v_rest >> 63);
            IF v_rest < 0 THEN
                RAISE EXCEPTION 'avro_head: field % is out of range', i USING ERRCODE = '22003';
            END IF;
            WHILE v_rest >= 128 LOOP
                v_out := v_out
                    || pg_catalog.set_byte('\\x00'::bytea, 0, ((v_rest & 127) | 128)::integer);
                v_rest := v_rest >> 7;
            END LOOP;
            v_out := v_out || pg_catalog.set_byte('\\x00'::bytea, 0, v_rest::integer) || v_bytes;
        END LOOP;
        RETURN v_out;
    END $$
    """,
    f"""
    CREATE FUNCTION {SCHEMA}.start_run(
        p_run_id text, p_tenant_id text, p_agent_id text, p_subject_ids text[],
        p_chain_head text, p_parent_run_id text, p_code_version text,
        p_classification text, p_retention_class text, p_credential_hash bytea)
    RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
        IF NOT {SCHEMA}.granted_tenant(p_tenant_id) THEN
            RAISE EXCEPTION 'role % may not write runs of tenant %',
                session_user, quote_literal(p_tenant_id) {_REFUSE},
                HINT = 'grant the tenant to the role: blackbox tenants grant ROLE TENANT';
        END IF;
        IF p_credential_hash IS NULL OR length(p_credential_hash) <> 32 THEN
            RAISE EXCEPTION 'a run needs the SHA-256 of its writer credential'
                USING ERRCODE = '22023';
        END IF;
        -- This writer's own run, committed by an earlier attempt whose commit the caller
        -- never heard back from: false, and the caller carries on (exactly once).
        IF EXISTS (SELECT 1 FROM {SCHEMA}.run_writers w
                    WHERE w.run_id = p_run_id AND w.credential_hash = p_credential_hash) THEN
            RETURN false;
        END IF;
        INSERT INTO {SCHEMA}.runs
            (run_id, tenant_id, agent_id, subject_ids, chain_head, parent_run_id,
             code_version, classification, retention_class)
        VALUES
            (p_run_id, p_tenant_id, p_agent_id, p_subject_ids, p_chain_head, p_parent_run_id,
             p_code_version, p_classification, p_retention_class);
        INSERT INTO {SCHEMA}.run_writers (run_id, credential_hash, writer)
        VALUES (p_run_id, p_credential_hash, session_user);
        RETURN true;
    END $$
    """,
    f"""
    CREATE FUNCTION {SCHEMA}.take_over_run(p_run_id text, p_credential_hash bytea)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE
        v_tenant text;
        v_status text;
        v_updated timestamptz;
        v_writer text;
    BEGIN
        SELECT r.tenant_id, r.status, r.updated_at, w.writer
          INTO v_tenant, v_status, v_updated, v_writer
          FROM {SCHEMA}.runs r LEFT JOIN {SCHEMA}.run_writers w USING (run_id)
         WHERE r.run_id = p_run_id FOR UPDATE OF r;
        IF NOT FOUND OR NOT {SCHEMA}.granted_tenant(v_tenant) THEN
            RAISE EXCEPTION 'run % does not exist or is not of a tenant granted to role %',
                quote_literal(p_run_id), session_user {_REFUSE};
        END IF;
        IF v_status <> 'running' THEN
            RAISE EXCEPTION 'run % is %; only running runs resume',
                quote_literal(p_run_id), v_status USING ERRCODE = '55000';
        END IF;
        -- Another login takes over only a run that went quiet: its writer may still be
        -- alive. The same login (a restarted process) may at once; so may the owner.
        IF v_writer IS DISTINCT FROM session_user
           AND v_updated > now() - interval '{TAKE_OVER_AFTER_S} seconds'
           AND NOT {SCHEMA}.owns_schema() THEN
            RAISE EXCEPTION 'run % had an event % ago and its writer is another login (%): '
                'it may still be recording; take it over once it has been quiet for '
                '{TAKE_OVER_AFTER_S} seconds', quote_literal(p_run_id),
                date_trunc('second', now() - v_updated), v_writer USING ERRCODE = '55006';
        END IF;
        IF p_credential_hash IS NULL OR length(p_credential_hash) <> 32 THEN
            RAISE EXCEPTION 'a writer needs the SHA-256 of its credential' USING ERRCODE = '22023';
        END IF;
        INSERT INTO {SCHEMA}.run_writers (run_id, credential_hash, writer)
        VALUES (p_run_id, p_credential_hash, session_user)
        ON CONFLICT (run_id) DO UPDATE
           SET credential_hash = excluded.credential_hash, writer = excluded.writer,
               since = now();
    END $$
    """,
    f"""
    CREATE FUNCTION {SCHEMA}.store_data_key(
        p_run_id text, p_credential bytea, p_key_id text, p_tenant_id text,
        p_kek_version text, p_wrapped bytea)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
        IF NOT EXISTS (
            SELECT 1 FROM {SCHEMA}.runs r JOIN {SCHEMA}.run_writers w USING (run_id)
             WHERE r.run_id = p_run_id AND r.tenant_id = p_tenant_id
               AND w.credential_hash = sha256(p_credential)
               AND {SCHEMA}.granted_tenant(r.tenant_id)) THEN
            RAISE EXCEPTION 'this writer may not store keys for run %: it did not start it',
                quote_literal(p_run_id) {_REFUSE};
        END IF;
        INSERT INTO {SCHEMA}.data_keys (key_id, run_id, tenant_id, kek_version, wrapped)
        VALUES (p_key_id, p_run_id, p_tenant_id, p_kek_version, p_wrapped);
    END $$
    """,
    # Content-addressed: a body is stored only under its own digest, so no writer can
    # plant other bytes under the digest a later event will name.
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
    """,
    # One guarded UPDATE does the common case; only when it matched nothing is the reason
    # looked up (a refusal, or false: another attempt moved the run on).
    f"""
    CREATE FUNCTION {SCHEMA}.append_event(
        p_run_id text, p_credential bytea, p_shard smallint, p_sequence bigint,
        p_chain_hash text, p_status text, p_state text, p_event_id uuid, p_envelope bytea,
        p_key_id text, p_effect text, p_effect_key text, p_effect_status text,
        p_external_id text, p_event_type text, p_body_version integer, p_recorded_at bigint)
    RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE
        v_status text;
        v_last bigint;
        v_hash bytea;
        v_count bigint;
    BEGIN
        -- One statement in the common case: the guarded UPDATE and the outbox row. The
        -- envelope must say what the row says (its event id, run, sequence and the run's
        -- tenant, the first fields of its Avro record after the 10-byte single-object
        -- header); otherwise the relay would publish, under this run's key, an event of
        -- another run or tenant.
        WITH advanced AS (
            UPDATE {SCHEMA}.runs r
               SET last_sequence = p_sequence, chain_head = p_chain_hash,
                   status = coalesce(p_status, r.status), state = coalesce(p_state, r.state),
                   updated_at = now()
             WHERE r.run_id = p_run_id AND r.last_sequence = p_sequence - 1
               AND r.status = 'running'
               AND EXISTS (SELECT 1 FROM {SCHEMA}.run_writers w
                            WHERE w.run_id = p_run_id
                              AND w.credential_hash = sha256(p_credential))
               AND CASE WHEN p_key_id IS NULL
                        THEN NOT EXISTS (SELECT 1 FROM {SCHEMA}.data_keys k
                                          WHERE k.run_id = p_run_id)
                        ELSE EXISTS (SELECT 1 FROM {SCHEMA}.data_keys k
                                      WHERE k.key_id = p_key_id AND k.run_id = p_run_id)
                   END
               AND substring(p_envelope FROM 1 FOR 2) = '\\xc301'::bytea
               AND position({SCHEMA}.avro_head('sslslls',
                       ARRAY[p_event_id::text, p_run_id, p_sequence::text, p_event_type,
                             p_body_version::text, p_recorded_at::text, r.tenant_id])
                   IN substring(p_envelope FROM 11)) = 1
            RETURNING r.run_id
        )
        INSERT INTO {SCHEMA}.outbox (shard, run_id, sequence, event_id, envelope)
        SELECT p_shard, advanced.run_id, p_sequence, p_event_id, p_envelope FROM advanced;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count = 0 THEN
            SELECT r.status, r.last_sequence, w.credential_hash
              INTO v_status, v_last, v_hash
              FROM {SCHEMA}.runs r LEFT JOIN {SCHEMA}.run_writers w USING (run_id)
             WHERE r.run_id = p_run_id;
            IF NOT FOUND OR v_hash IS DISTINCT FROM sha256(p_credential) THEN
                RAISE EXCEPTION 'run % does not exist or was not started by this writer',
                    quote_literal(p_run_id) {_REFUSE};
            END IF;
            IF v_status <> 'running' THEN
                RAISE EXCEPTION 'run % is %; it takes no more events',
                    quote_literal(p_run_id), v_status USING ERRCODE = '55000';
            END IF;
            IF v_last <> p_sequence - 1 THEN
                RETURN false;
            END IF;
            IF p_key_id IS NULL AND EXISTS (SELECT 1 FROM {SCHEMA}.data_keys k
                                             WHERE k.run_id = p_run_id) THEN
                RAISE EXCEPTION 'run % is sealed under a data key: refusing a plaintext body',
                    quote_literal(p_run_id) {_REFUSE};
            END IF;
            IF p_key_id IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM {SCHEMA}.data_keys k
                 WHERE k.key_id = p_key_id AND k.run_id = p_run_id) THEN
                RAISE EXCEPTION 'key % is not a data key of run %',
                    quote_literal(p_key_id), quote_literal(p_run_id) {_REFUSE};
            END IF;
            RAISE EXCEPTION 'the envelope of run % sequence % does not carry that run, '
                'sequence, event id and tenant', quote_literal(p_run_id), p_sequence {_REFUSE};
        END IF;
        IF p_event_type = 'effect.intent' AND p_effect_key IS NOT NULL THEN
            INSERT INTO {SCHEMA}.effects (run_id, idempotency_key, effect, intent_sequence)
            VALUES (p_run_id, p_effect_key, p_effect, p_sequence);
        ELSIF p_event_type = 'effect.receipt' AND p_effect_key IS NOT NULL THEN
            UPDATE {SCHEMA}.effects
               SET status = p_effect_status, external_id = p_external_id, updated_at = now()
             WHERE run_id = p_run_id AND idempotency_key = p_effect_key;
        END IF;
        RETURN true;
    END $$
    """,
]


def downgrade() -> None:
    op.execute(f"DROP POLICY IF EXISTS effects_of_granted_tenants ON {SCHEMA}.effects")
    op.execute(f"DROP POLICY IF EXISTS runs_of_granted_tenants ON {SCHEMA}.runs")
    op.execute(f"ALTER TABLE {SCHEMA}.effects DISABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {SCHEMA}.runs DISABLE ROW LEVEL SECURITY")
    for signature in _GRANTS:
        op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.{signature}")
    op.drop_table("run_writers", schema=SCHEMA)
    op.drop_table("tenant_grants", schema=SCHEMA)
    writer = "blackbox_writer"
    op.execute(f"GRANT INSERT, UPDATE ON {SCHEMA}.runs, {SCHEMA}.effects TO {writer}")
    op.execute(f"GRANT INSERT ON {SCHEMA}.outbox, {SCHEMA}.data_keys, {SCHEMA}.blobs TO {writer}")
