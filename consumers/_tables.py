"""The read-side tables, all in the Postgres schema ``blackbox_views``.

The write side owns the schema ``blackbox``; nothing here reads or writes it. The
migration in ``consumers/migrations`` creates exactly these tables; keep both in step.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR

VIEWS_SCHEMA = "blackbox_views"
"""The Postgres schema that holds every read-side table."""

metadata = MetaData(schema=VIEWS_SCHEMA)

runs_view = Table(
    "runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'running'")),
    Column("event_count", BigInteger, nullable=False, server_default=text("0")),
    Column("last_sequence", BigInteger, nullable=False, server_default=text("0")),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("last_event_at", DateTime(timezone=True), nullable=False),
    Column("code_version", Text),
    Column("parent_run_id", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Its data keys were destroyed: replay checks control flow from digests only.
    Column("limited_replay", Boolean, nullable=False, server_default=text("false")),
    Column("redacted_at", DateTime(timezone=True)),
    # Calls the run's code made through no boundary (run.finished's attributes).
    Column("unrecorded_calls", Integer),
    Column("unrecorded_call", Text),
    # The run's session and end user, from run.started (NULL once the run is shredded).
    Column("session_id", Text),
    Column("user_id", Text),
    # The sequence of its run.finished: what may follow it is judged (see _vouching).
    Column("finished_sequence", BigInteger),
    Index("ix_runs_tenant_agent", "tenant_id", "agent_id"),
)
"""One row per run: status, counts and the run.started / run.finished facts."""

events_index = Table(
    "events",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("event_id", Text, nullable=False, unique=True),
    Column("event_type", Text, nullable=False),
    Column("body_version", Integer, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("input_digest", Text, nullable=False),
    Column("output_digest", Text, nullable=False),
    Column("chain_hash", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("key_id", Text),
    Column("payload_ref", Text),
    # The envelope's unsealed attributes (model, tokens, tool, status, branch, tags...).
    Column("attributes", JSONB),
    # Why the write side does not vouch for the event (NULL: it does; see _vouching).
    Column("unverified", Text),
    PrimaryKeyConstraint("run_id", "sequence"),
    Index("ix_events_topic_partition_offset", "topic", "partition", "offset"),
    Index(
        "ix_events_unverified",
        "run_id",
        "sequence",
        postgresql_where=text("unverified IS NOT NULL"),
    ),
)
"""Where every event lives in Kafka, with its digests; never the payload."""

integrity_violations = Table(
    "integrity_violations",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("kind", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("existing_input_digest", Text, nullable=False),
    Column("existing_output_digest", Text, nullable=False),
    Column("existing_chain_hash", Text, nullable=False),
    Column("incoming_input_digest", Text, nullable=False),
    Column("incoming_output_digest", Text, nullable=False),
    Column("incoming_chain_hash", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("detected_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # A re-delivered copy of the same offending event is recorded once.
    UniqueConstraint(
        "run_id",
        "sequence",
        "event_id",
        "incoming_chain_hash",
        name="uq_integrity_violations_incoming",
    ),
)
"""An event that collides with a stored one but differs in its digests or chain hash."""

consumer_offsets = Table(
    "consumer_offsets",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # {"<shard>": epoch}: the consumer's epoch fence for this partition (see broker).
    Column("lease_epochs", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    PrimaryKeyConstraint("group_id", "topic", "partition"),
)
"""The next Kafka offset each consumer group reads, and the newest relay lease epoch it
read per outbox shard there, committed with the view rows."""

chain_heads = Table(
    "chain_heads",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("last_sequence", BigInteger, nullable=False),
    Column("chain_head", Text, nullable=False),
    Column("broken_at", BigInteger),
    Column("tenant_id", Text),
    Column("finished", Boolean, nullable=False, server_default=text("false")),
    Column("sealed", Boolean, nullable=False, server_default=text("false")),
    Column("signed_sequence", BigInteger, nullable=False, server_default=text("0")),
    Column("check_after", DateTime(timezone=True)),
    Index(
        "ix_chain_heads_check_after",
        "check_after",
        postgresql_where=text("check_after IS NOT NULL AND broken_at IS NULL"),
    ),
)
"""The checkpoint signer's position in each run's hash chain: how far it followed the
chain, whether it saw run.finished and a data key, how far it last signed and when an
unsigned head is next due to be compared with ``blackbox.runs``."""

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("last_sequence", BigInteger, nullable=False),
    Column("chain_head", Text, nullable=False),
    Column("signer_key_id", Text, nullable=False),
    Column("signature", Text, nullable=False),
    Column("signed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished", Boolean),
)
"""The latest signed chain head of each run (Ed25519, base64): at its end, or mid-run
(``finished`` false) for a run still running or one that crashed. NULL ``finished``: a
first-form checkpoint, signed only at a run's end."""


def _call_columns() -> list[Column[object]]:
    return [
        Column("run_id", Text, primary_key=True),
        Column("sequence", BigInteger, primary_key=True),
        Column("event_id", Text, nullable=False),
        Column("tenant_id", Text, nullable=False),
        Column("agent_id", Text, nullable=False),
        Column("recorded_at", DateTime(timezone=True), nullable=False),
        Column("latency_ms", Float),
        Column("error_class", Text),
        # Why the write side does not vouch for the call (NULL: it does): left out of
        # every total.
        Column("unverified", Text),
    ]


llm_calls = Table(
    "llm_calls",
    metadata,
    *_call_columns(),
    Column("provider", Text),
    Column("model", Text),
    Column("prompt_tokens", BigInteger),
    Column("completion_tokens", BigInteger),
    Column("cached_tokens", BigInteger),
    Column("total_tokens", BigInteger),
    Column("finish_reason", Text),
    Column("truncated", Boolean, nullable=False, server_default=text("false")),
    Column("prompt_version", Text),
    Column("code_version", Text),
    Column("streamed", Boolean),
    Column("tool_calls_requested", Integer),
    # Of those, how many broke the schema the request declared (NULL: no schema known).
    Column("tool_calls_invalid", Integer),
    # Input written to the provider's prompt cache (priced above the input price).
    Column("cache_write_tokens", BigInteger),
    # Exact dollars at the price in force when the call was read (NULL: unknown).
    Column("cost_usd", Numeric),
    Column("price_as_of", Date),
)
"""One row per ``llm.call``, from its unsealed attributes (no body, no data key)."""

tool_calls = Table("tool_calls", metadata, *_call_columns(), Column("tool", Text))
"""One row per ``tool.call``."""

effect_calls = Table(
    "effects",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("key_digest", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("effect", Text),
    Column("intent_sequence", BigInteger),
    Column("intent_at", DateTime(timezone=True)),
    Column("receipt_sequence", BigInteger),
    Column("receipt_at", DateTime(timezone=True)),
    Column("status", Text),
)
"""One row per effect intent, its receipt paired by (run, digest of the idempotency
key); ``receipt_sequence`` NULL: an open intent."""


def _count(name: str, kind: type[BigInteger] | type[Integer] = Integer) -> Column[int]:
    return Column(name, kind, nullable=False, server_default=text("0"))


run_rollups = Table(
    "run_rollups",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("code_version", Text),
    Column("prompt_version", Text),
    Column("tags", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # ``id@digest`` of each prompt template of the run's snapshot.
    Column("prompt_templates", Text),
    Column("started_at", DateTime(timezone=True)),
    _count("llm_calls"),
    _count("tool_calls"),
    _count("errors"),
    _count("streamed_calls"),
    _count("prompt_tokens", BigInteger),
    _count("completion_tokens", BigInteger),
    _count("total_tokens", BigInteger),
    Column("llm_latency_ms", Float, nullable=False, server_default=text("0")),
    Column("max_latency_ms", Float),
    Column("models", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    _count("cached_tokens", BigInteger),
    # The sum of its priced calls (NULL: none priced yet); calls that did not fail and
    # have no known cost are counted apart, so a partial sum never reads as the whole.
    Column("cost_usd", Numeric),
    _count("unpriced_calls"),
    # What the run list's search finds a run by, each GIN-indexed in one table so that
    # several terms intersect as bitmaps: the tools it called, the error classes it
    # and its calls failed with, and the words of its LLM messages (tenants that opted
    # in; positions stripped, the calls' own rows in message_text keep them).
    Column("tools", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("error_classes", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("words", TSVECTOR),
)
"""One row per run from the analytics consumer: its tags and prompt version (from
``run.started``) and its LLM and tool calls summed; each call is added once."""

text_search_tenants = Table(
    "text_search_tenants",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("enabled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("enabled_by", Text, nullable=False, server_default=text("session_user")),
)
"""The tenants that opted in to full-text search over their redacted LLM messages."""

message_text = Table(
    "message_text",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("sequence", BigInteger, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("words", TSVECTOR, nullable=False),
)
"""The words of each ``llm.call``'s messages and answer, as recorded (so redacted), of
the tenants that opted in: a full-text index, never the text itself."""
