"""Keys: digest keys only through an audited function, unwrap audits that survive rollback.

Revision ID: 0005
Revises: 0004

Digest keys (issue 11, items 8 and 9). The writer role loses every privilege on
``blackbox.tenant_keys``. A tenant's agents get its digest key from
``blackbox.tenant_digest_key(tenant, secret, kek_version, wrapped)``, a SECURITY DEFINER
function that answers only a session user granted that tenant
(``blackbox.granted_tenant``), writes an audit row and a server log line, and creates the
key on first use from what the first writer offers: a fresh key and that key wrapped
under the current KEK. Agents hold only the public half of the KEK and cannot unwrap the
wrapped copy, so the function returns the raw key from ``blackbox.tenant_digest_keys``, a
table no role is granted. The wrapped copy in ``tenant_keys`` stays for the replayer
(through the audited ``unwrap_tenant_key``), rotation and backups. Digest keys made
before this revision have no raw copy until ``blackbox keys rotate`` (which holds the
private KEK) stores one; until then agents holding a symmetric KEK unwrap the wrapped
copy as before, and wrap-only agents are refused with that instruction.

What a stolen dump of this database reveals: the raw digest keys, so guesses of
low-entropy values can be confirmed against the digests in that same dump and in the
topic; no body and no data key (data keys are wrapped under KEKs that are not in the
database, and under key pairs agents hold only the public half of). A dump made for
others should leave out ``blackbox.tenant_digest_keys``; ``keys rotate`` refills it.

Audit that survives rollback (item 11): two steps, not an autonomous write. A replayer
first calls ``blackbox.request_key_access(purpose, run_id | tenant_id)``, which checks the
purpose and the tenant grant and writes a ``requested`` audit row with its transaction
id, and commits; ``unwrap_data_key(run, key, request)`` and
``unwrap_tenant_key(tenant, request)`` then hand out a wrapped key only against a request
of the same session user, for the same run or tenant, under an hour old, whose
transaction ``pg_xact_status`` reports committed. A caller that rolls back the unwrap (or
requests and unwraps in one transaction, which is refused) cannot take back the request
row, so every key handed out has a committed audit row saying who, why and for what. An
autonomous write through ``dblink`` was not chosen: it opens a second connection per
call with credentials stored where the function can reach them (a non-superuser owner
must give a password in the connection string), it needs the extension in every
database, including managed ones that may not offer it, and a dropped second connection
would either lose the row or block the unwrap anyway. The two-step way costs one
committed round trip per run read, not per key. A writer's fetch of its own tenant's
digest key stays one step (an audit row in its transaction, and the server log line,
which no rollback removes): the writer is entitled to it, since it records that tenant's
plaintext anyway, and the grant check is what keeps other tenants' keys from it.

The purpose is checked in SQL too (:func:`blackbox.purpose_problem`): 3 to 500
characters, no control, format, line or paragraph separator characters, so no caller
can forge a server log line through it; log lines quote agent-chosen ids as JSON.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"

# Characters a purpose may not hold: C0 and C1 controls, and Unicode format (Cf), line
# and paragraph separator characters (bidirectional overrides, zero-width characters).
# \u and \U take exactly 4 and 8 hex digits, so no escape runs into the next one.
_REFUSED = (
    r"[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
    r"\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    r"\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0001\U000e0020-\U000e007f]"
)

_REQUEST_CHECK = f"""
            SELECT a.id, a.purpose, a.request_xact INTO req FROM {SCHEMA}.access_audit a
             WHERE a.id = p_request AND a.outcome = 'requested'
               AND a.principal = session_user AND a.at > now() - interval '1 hour'
               AND a.run_id IS NOT DISTINCT FROM v_run
               AND a.tenant_id IS NOT DISTINCT FROM v_tenant;
            IF req.id IS NULL THEN
                RAISE EXCEPTION 'no access request % of role % for this key (or it is over an '
                    'hour old): call blackbox.request_key_access with a purpose and commit it, '
                    'then unwrap', p_request, session_user USING ERRCODE = '55000';
            END IF;
            IF pg_xact_status(req.request_xact::text::xid8) IS DISTINCT FROM 'committed' THEN
                RAISE EXCEPTION 'access request % is not committed: commit the request in a '
                    'transaction of its own before unwrapping, so the audit keeps it whatever '
                    'the unwrapping transaction does', p_request USING ERRCODE = '55000';
            END IF;
"""


def upgrade() -> None:
    op.execute(f"ALTER TABLE {SCHEMA}.access_audit ADD COLUMN request_xact bigint")
    op.execute(
        f"""
        CREATE TABLE {SCHEMA}.tenant_digest_keys (
            tenant_id text PRIMARY KEY,
            secret bytea NOT NULL CHECK (length(secret) = 32),
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(f"REVOKE ALL ON {SCHEMA}.tenant_digest_keys FROM PUBLIC")
    op.execute(f"REVOKE ALL ON {SCHEMA}.tenant_keys FROM blackbox_writer")
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.unwrap_data_key(text, text, text)")
    op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.unwrap_tenant_key(text, text)")
    _purpose_problem()
    _request_key_access()
    _unwrap_data_key()
    _unwrap_tenant_key()
    _tenant_digest_key()
    grants = {
        "request_key_access(text, text, text)": "blackbox_replayer",
        "unwrap_data_key(text, text, bigint)": "blackbox_replayer",
        "unwrap_tenant_key(text, bigint)": "blackbox_replayer",
        "tenant_digest_key(text, bytea, text, bytea)": "blackbox_writer",
    }
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.purpose_problem(text) FROM PUBLIC")
    for function, role in grants.items():
        op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.{function} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{function} TO {role}")


def _purpose_problem() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.purpose_problem(p_purpose text) RETURNS text
        LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
            SELECT CASE
                WHEN p_purpose IS NULL OR length(btrim(p_purpose)) = 0 THEN
                    'the purpose is empty; say why the recorded bodies are read'
                WHEN length(btrim(p_purpose)) < 3 THEN
                    'the purpose is too short (at least 3 characters)'
                WHEN length(p_purpose) > 500 THEN
                    'the purpose is too long (at most 500 characters)'
                WHEN p_purpose ~ '{_REFUSED}' THEN
                    'the purpose contains a control character; write it as one line of plain text'
            END
        $$
        """
    )


def _request_key_access() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.request_key_access(
            p_purpose text, p_run_id text DEFAULT NULL, p_tenant_id text DEFAULT NULL)
        RETURNS bigint
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            problem text := {SCHEMA}.purpose_problem(p_purpose);
            v_tenant text := p_tenant_id;
            v_id bigint;
        BEGIN
            IF problem IS NOT NULL THEN
                RAISE EXCEPTION '%', problem USING ERRCODE = '22023';
            END IF;
            IF (p_run_id IS NULL) = (p_tenant_id IS NULL) THEN
                RAISE EXCEPTION 'request access to the keys of one run or one tenant'
                    USING ERRCODE = '22023';
            END IF;
            IF p_run_id IS NOT NULL THEN
                SELECT k.tenant_id INTO v_tenant FROM {SCHEMA}.data_keys k
                 WHERE k.run_id = p_run_id LIMIT 1;
            END IF;
            IF v_tenant IS NOT NULL AND NOT {SCHEMA}.granted_tenant(v_tenant) THEN
                RAISE EXCEPTION 'role % is not granted tenant %', session_user, to_json(v_tenant)
                    USING ERRCODE = '42501';
            END IF;
            INSERT INTO {SCHEMA}.access_audit
                   (principal, purpose, run_id, tenant_id, outcome, request_xact)
            VALUES (session_user, p_purpose, p_run_id, v_tenant, 'requested',
                    pg_current_xact_id()::text::bigint)
            RETURNING id INTO v_id;
            RAISE LOG 'blackbox key access requested: request=% principal=% purpose=% '
                'run=% tenant=%', v_id, session_user, to_json(p_purpose), to_json(p_run_id),
                to_json(v_tenant);
            RETURN v_id;
        END $$
        """
    )


def _unwrap_data_key() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.unwrap_data_key(p_run_id text, p_key_id text, p_request bigint)
        RETURNS TABLE (key_id text, kek_version text, wrapped bytea, destroyed_at timestamptz)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            found record;
            req record;
            v_run text := p_run_id;
            v_tenant text;
        BEGIN
            SELECT k.key_id, k.tenant_id, k.kek_version, k.wrapped, k.destroyed_at INTO found
              FROM {SCHEMA}.data_keys k
             WHERE k.run_id = p_run_id AND k.key_id = p_key_id;
            SELECT k.tenant_id INTO v_tenant FROM {SCHEMA}.data_keys k
             WHERE k.run_id = p_run_id LIMIT 1;
            {_REQUEST_CHECK}
            IF v_tenant IS NOT NULL AND NOT {SCHEMA}.granted_tenant(v_tenant) THEN
                RAISE EXCEPTION 'role % is not granted tenant %', session_user, to_json(v_tenant)
                    USING ERRCODE = '42501';
            END IF;
            INSERT INTO {SCHEMA}.access_audit
                   (principal, purpose, run_id, tenant_id, key_id, outcome, request_xact)
            VALUES (session_user, req.purpose, p_run_id, v_tenant, p_key_id,
                    CASE WHEN found.key_id IS NULL THEN 'missing'
                         WHEN found.wrapped IS NULL THEN 'destroyed'
                         ELSE 'granted' END, req.request_xact);
            RAISE LOG 'blackbox unwrap: request=% principal=% run=% key=%',
                p_request, session_user, to_json(p_run_id), to_json(p_key_id);
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


def _unwrap_tenant_key() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.unwrap_tenant_key(p_tenant_id text, p_request bigint)
        RETURNS TABLE (kek_version text, wrapped bytea)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            req record;
            v_run text := NULL;
            v_tenant text := p_tenant_id;
        BEGIN
            {_REQUEST_CHECK}
            IF NOT {SCHEMA}.granted_tenant(p_tenant_id) THEN
                RAISE EXCEPTION 'role % is not granted tenant %', session_user, to_json(p_tenant_id)
                    USING ERRCODE = '42501';
            END IF;
            INSERT INTO {SCHEMA}.access_audit
                   (principal, purpose, tenant_id, outcome, request_xact)
            VALUES (session_user, req.purpose, p_tenant_id, 'digest key', req.request_xact);
            RAISE LOG 'blackbox unwrap: request=% principal=% tenant digest key=%',
                p_request, session_user, to_json(p_tenant_id);
            RETURN QUERY SELECT t.kek_version, t.wrapped FROM {SCHEMA}.tenant_keys t
                          WHERE t.tenant_id = p_tenant_id;
        END $$
        """
    )


def _tenant_digest_key() -> None:
    # The first writer of a tenant offers the key and its wrapped copy; later ones (and
    # concurrent ones, once the first commits) get the stored key back.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.tenant_digest_key(
            p_tenant_id text, p_secret bytea, p_kek_version text, p_wrapped bytea)
        RETURNS TABLE (secret bytea, kek_version text, wrapped bytea)
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            IF p_tenant_id IS NULL OR NOT {SCHEMA}.granted_tenant(p_tenant_id) THEN
                RAISE EXCEPTION 'role % is not granted tenant %', session_user, to_json(p_tenant_id)
                    USING ERRCODE = '42501';
            END IF;
            IF p_secret IS NOT NULL THEN
                IF length(p_secret) <> 32 OR p_kek_version IS NULL OR p_wrapped IS NULL THEN
                    RAISE EXCEPTION 'a new digest key is 32 bytes with its wrapped copy'
                        USING ERRCODE = '22023';
                END IF;
                INSERT INTO {SCHEMA}.tenant_keys (tenant_id, kek_version, wrapped)
                VALUES (p_tenant_id, p_kek_version, p_wrapped) ON CONFLICT (tenant_id) DO NOTHING;
                IF FOUND THEN
                    INSERT INTO {SCHEMA}.tenant_digest_keys (tenant_id, secret)
                    VALUES (p_tenant_id, p_secret);
                END IF;
            END IF;
            INSERT INTO {SCHEMA}.access_audit (principal, purpose, tenant_id, outcome)
            VALUES (session_user, 'recording', p_tenant_id, 'digest key to writer');
            RAISE LOG 'blackbox digest key: principal=% tenant=%',
                session_user, to_json(p_tenant_id);
            RETURN QUERY SELECT d.secret, NULL::text, NULL::bytea FROM {SCHEMA}.tenant_digest_keys d
                          WHERE d.tenant_id = p_tenant_id;
            IF NOT FOUND THEN  -- made before 0005: only the wrapped copy exists
                RETURN QUERY SELECT NULL::bytea, t.kek_version, t.wrapped
                               FROM {SCHEMA}.tenant_keys t WHERE t.tenant_id = p_tenant_id;
            END IF;
        END $$
        """
    )


def downgrade() -> None:
    for function in (
        "tenant_digest_key(text, bytea, text, bytea)",
        "unwrap_tenant_key(text, bigint)",
        "unwrap_data_key(text, text, bigint)",
        "request_key_access(text, text, text)",
        "purpose_problem(text)",
    ):
        op.execute(f"DROP FUNCTION IF EXISTS {SCHEMA}.{function}")
    op.execute(f"DROP TABLE {SCHEMA}.tenant_digest_keys")
    op.execute(f"ALTER TABLE {SCHEMA}.access_audit DROP COLUMN request_xact")
    op.execute(f"GRANT SELECT, INSERT ON {SCHEMA}.tenant_keys TO blackbox_writer")
    # 0002's one-step functions, as 0002 made them.
    spec = importlib.util.spec_from_file_location(
        "blackbox_0002", Path(__file__).with_name("0002_keys_and_roles.py")
    )
    assert spec is not None
    assert spec.loader is not None
    earlier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(earlier)
    earlier._unwrap_function()
    for function in ("unwrap_data_key(text, text, text)", "unwrap_tenant_key(text, text)"):
        op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{function} TO blackbox_replayer")
