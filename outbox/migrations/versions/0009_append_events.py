"""A group flush appends its events in one call.

Revision ID: 0009
Revises: 0008

Group commit wrote a batch by calling ``append_event`` once per event inside one
statement: per event a SECURITY DEFINER call (its pinned ``search_path`` set and reset),
an UPDATE of the run's row (a new row version each time) and an INSERT. Postgres spent
longer on a 256-event batch than the agent took to buffer the next one, so the agent
waited for it.

``blackbox.append_events`` takes the batch's columns as arrays and does the same checks
once where they concern the run, and per event where they concern the event:

- the arrays are one-dimensional and of one length, the sequences follow each other, and
  every event is of a type group commit buffers (clock reads, random draws, tool and LLM
  calls, retrievals: nothing that writes ``effects`` or changes the run's status, which
  stay with ``append_event``);
- one guarded UPDATE moves the run from the sequence before the first event to the last,
  under the writer's credential, while the run is ``running``;
- every body is sealed under a data key of the run when the run has one, and every
  envelope carries its own event id, run, sequence, type, body version, time and the
  run's tenant at the head of its Avro record;
- one INSERT adds the outbox rows in sequence order.

It returns how many events it appended: all of them, or 0 when the run was not at the
sequence before the first (another attempt moved it on). A refusal raises, as
``append_event`` does, and leaves nothing written.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SCHEMA = "blackbox"
ROLE = "blackbox_writer"
SIGNATURE = (
    "append_events(text, bytea, smallint, bigint[], text[], uuid[], bytea[], text[], text[], "
    "integer[], bigint[])"
)
_REFUSE = "USING ERRCODE = '42501'"
_INVALID = "USING ERRCODE = '22023'"


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.append_events(
            p_run_id text, p_credential bytea, p_shard smallint, p_sequences bigint[],
            p_chain_hashes text[], p_event_ids uuid[], p_envelopes bytea[], p_key_ids text[],
            p_event_types text[], p_body_versions integer[], p_recorded_ats bigint[])
        RETURNS integer
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        DECLARE
            v_count integer := coalesce(cardinality(p_sequences), 0);
            v_first bigint := p_sequences[1];
            v_tenant text;
            v_status text;
            v_last bigint;
            v_hash bytea;
            v_bad text;
        BEGIN
            IF v_count = 0 OR v_first IS NULL
               OR array_ndims(p_sequences) <> 1 OR array_ndims(p_chain_hashes) <> 1
               OR array_ndims(p_event_ids) <> 1 OR array_ndims(p_envelopes) <> 1
               OR array_ndims(p_key_ids) <> 1 OR array_ndims(p_event_types) <> 1
               OR array_ndims(p_body_versions) <> 1 OR array_ndims(p_recorded_ats) <> 1
               OR cardinality(p_chain_hashes) <> v_count OR cardinality(p_event_ids) <> v_count
               OR cardinality(p_envelopes) <> v_count OR cardinality(p_key_ids) <> v_count
               OR cardinality(p_event_types) <> v_count
               OR cardinality(p_body_versions) <> v_count
               OR cardinality(p_recorded_ats) <> v_count THEN
                RAISE EXCEPTION 'append_events: a batch of run % needs one-dimensional arrays '
                    'of one length, at least one event', quote_literal(p_run_id) {_INVALID};
            END IF;
            IF EXISTS (SELECT 1 FROM unnest(p_sequences) WITH ORDINALITY AS s(sequence, i)
                        WHERE s.sequence IS DISTINCT FROM v_first + s.i - 1) THEN
                RAISE EXCEPTION 'append_events: the sequences of a batch of run % must follow '
                    'each other', quote_literal(p_run_id) {_INVALID};
            END IF;
            SELECT t.event_type INTO v_bad FROM unnest(p_event_types) AS t(event_type)
             WHERE t.event_type IS NULL OR t.event_type NOT IN
                   ('clock.read', 'random.draw', 'tool.call', 'llm.call', 'retrieval')
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'append_events: a batch carries no % event; append it with '
                    'append_event', coalesce(quote_literal(v_bad), 'untyped') {_INVALID};
            END IF;

            UPDATE {SCHEMA}.runs r
               SET last_sequence = v_first + v_count - 1,
                   chain_head = p_chain_hashes[v_count], updated_at = now()
             WHERE r.run_id = p_run_id AND r.last_sequence = v_first - 1
               AND r.status = 'running'
               AND EXISTS (SELECT 1 FROM {SCHEMA}.run_writers w
                            WHERE w.run_id = p_run_id
                              AND w.credential_hash = sha256(p_credential))
            RETURNING r.tenant_id INTO v_tenant;
            IF NOT FOUND THEN
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
                RETURN 0;  -- the run is not at the sequence before the batch
            END IF;

            IF EXISTS (SELECT 1 FROM {SCHEMA}.data_keys k WHERE k.run_id = p_run_id) THEN
                IF array_position(p_key_ids, NULL) IS NOT NULL THEN
                    RAISE EXCEPTION 'run % is sealed under a data key: refusing a plaintext '
                        'body', quote_literal(p_run_id) {_REFUSE};
                END IF;
            END IF;
            SELECT k.key_id INTO v_bad FROM unnest(p_key_ids) AS k(key_id)
             WHERE k.key_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM {SCHEMA}.data_keys d
                                WHERE d.key_id = k.key_id AND d.run_id = p_run_id)
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'key % is not a data key of run %',
                    quote_literal(v_bad), quote_literal(p_run_id) {_REFUSE};
            END IF;

            SELECT e.sequence::text INTO v_bad
              FROM unnest(p_sequences, p_event_ids, p_envelopes, p_event_types,
                          p_body_versions, p_recorded_ats)
                   AS e(sequence, event_id, envelope, event_type, body_version, recorded_at)
             WHERE NOT coalesce(
                       substring(e.envelope FROM 1 FOR 2) = '\\xc301'::bytea
                       AND position({SCHEMA}.avro_head('sslslls',
                               ARRAY[e.event_id::text, p_run_id, e.sequence::text,
                                     e.event_type, e.body_version::text,
                                     e.recorded_at::text, v_tenant])
                           IN substring(e.envelope FROM 11)) = 1,
                       false)
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'the envelope of run % sequence % does not carry that run, '
                    'sequence, event id and tenant', quote_literal(p_run_id), v_bad {_REFUSE};
            END IF;

            INSERT INTO {SCHEMA}.outbox (shard, run_id, sequence, event_id, envelope)
            SELECT p_shard, p_run_id, e.sequence, e.event_id, e.envelope
              FROM unnest(p_sequences, p_event_ids, p_envelopes) AS e(sequence, event_id, envelope)
             ORDER BY e.sequence;
            RETURN v_count;
        END $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SCHEMA}.{SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{SIGNATURE} TO {ROLE}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SCHEMA}.{SIGNATURE}")
