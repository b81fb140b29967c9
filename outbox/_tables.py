"""The write side's tables, in the Postgres schema ``blackbox``.

Created and changed only by the alembic migrations in ``outbox/migrations``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, OID, UUID

SCHEMA = "blackbox"
NOTIFY_CHANNEL = "blackbox_outbox"

metadata = MetaData(schema=SCHEMA)

runs = Table(
    "runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("subject_ids", ARRAY(Text), nullable=False, server_default="{}"),
    Column("status", Text, nullable=False, server_default="running"),
    # The sequence allocator and the head of the hash chain: every event of the run
    # advances both in the transaction that inserts it.
    Column("last_sequence", BigInteger, nullable=False, server_default="0"),
    Column("chain_head", Text, nullable=False),
    Column("parent_run_id", Text),
    Column("code_version", Text),
    Column("state", Text),
    Column("classification", Text, nullable=False, server_default="internal"),
    Column("retention_class", Text, nullable=False, server_default="standard"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("shard", SmallInteger, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("event_id", UUID(as_uuid=False), nullable=False),
    Column("envelope", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("outbox_shard_id", "shard", "id"),
)

blobs = Table(
    "blobs",
    metadata,
    Column("digest", Text, primary_key=True),
    Column("tenant_id", Text, primary_key=True),  # "" before blobs had a tenant: owner only
    Column("data", LargeBinary, nullable=False),
    Column("size", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

relay_leases = Table(
    "relay_leases",
    metadata,
    Column("shard", SmallInteger, primary_key=True),
    Column("owner", Text),
    Column("expires_at", DateTime(timezone=True)),
    Column("epoch", BigInteger, nullable=False, server_default="0"),
)

relay_members = Table(
    "relay_members",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

effects = Table(
    "effects",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("idempotency_key", Text, primary_key=True),
    Column("effect", Text, nullable=False),
    Column("intent_sequence", BigInteger, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("external_id", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

data_keys = Table(
    "data_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("run_id", Text, nullable=False, index=False),
    Column("tenant_id", Text, nullable=False),
    Column("kek_version", Text, nullable=False),
    Column("wrapped", LargeBinary),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("destroyed_at", DateTime(timezone=True)),
    Column("destroyed_reason", Text),
    Index("data_keys_run", "run_id"),
)

access_audit = Table(
    "access_audit",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("principal", Text, nullable=False),
    Column("purpose", Text, nullable=False),
    Column("run_id", Text),
    Column("tenant_id", Text),
    Column("key_id", Text),
    Column("outcome", Text, nullable=False),
    # The transaction that wrote a ``requested`` row: an unwrap is granted only against a
    # request whose transaction committed (revision 0005).
    Column("request_xact", BigInteger),
    Index("access_audit_run", "run_id", "at"),
)

deletion_ledger = Table(
    "deletion_ledger",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("action", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("key_ids", ARRAY(Text), nullable=False, server_default="{}"),
    Column("subject_id", Text),
    Column("reason", Text, nullable=False),
    Column("principal", Text, nullable=False),
    Index("deletion_ledger_run", "run_id"),
)

tenant_keys = Table(
    "tenant_keys",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("kek_version", Text, nullable=False),
    Column("wrapped", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# The raw digest keys agents get through ``blackbox.tenant_digest_key``; no role is
# granted this table (revision 0005). ``tenant_keys`` keeps each one wrapped under a KEK.
tenant_digest_keys = Table(
    "tenant_digest_keys",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("secret", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

tenant_grants = Table(
    "tenant_grants",
    metadata,
    Column("role_name", Text, primary_key=True),
    Column("tenant_id", Text, primary_key=True),
    Column("role_oid", OID, nullable=False),
    Column("granted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
