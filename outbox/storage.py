"""The write side's storage: its tables, the ``*_txn`` functions the other parts call on
them, its migrations and the blob reader over its ``blobs`` table.

This is what integrators and the pipeline use (the relay, the read side's checks, the
CLI's tenant grants, backups); an agent records through the Recorder and never needs it.
Each ``*_txn`` function takes the caller's ``Connection`` and never commits.
"""

from agent_blackbox.outbox._blobs import (
    UNATTRIBUTED,
    attribute_blobs_txn,
    remember_tenancy_heads_txn,
    tenancy_heads_txn,
    unattributed_blobs_txn,
    unclaimed_blobs_txn,
)
from agent_blackbox.outbox._heads import RunHead, run_heads_txn
from agent_blackbox.outbox._migrate import migrate_write_side
from agent_blackbox.outbox._postgres import PostgresBlobs, outbox_backlog_txn, pending_events_txn
from agent_blackbox.outbox._tables import (
    NOTIFY_CHANNEL,
    SCHEMA,
    access_audit,
    blobs,
    data_keys,
    deletion_ledger,
    effects,
    outbox,
    relay_leases,
    relay_members,
    runs,
    tenant_grants,
)
from agent_blackbox.outbox._tenants import (
    EVERY_TENANT,
    grant_tenant_txn,
    revoke_tenant_txn,
    tenant_grants_txn,
)
from agent_blackbox.outbox._writer import shard_of

__all__ = [
    "EVERY_TENANT",
    "NOTIFY_CHANNEL",
    "SCHEMA",
    "UNATTRIBUTED",
    "PostgresBlobs",
    "RunHead",
    "access_audit",
    "attribute_blobs_txn",
    "blobs",
    "data_keys",
    "deletion_ledger",
    "effects",
    "grant_tenant_txn",
    "migrate_write_side",
    "outbox",
    "outbox_backlog_txn",
    "pending_events_txn",
    "relay_leases",
    "relay_members",
    "remember_tenancy_heads_txn",
    "revoke_tenant_txn",
    "run_heads_txn",
    "runs",
    "shard_of",
    "tenancy_heads_txn",
    "tenant_grants",
    "tenant_grants_txn",
    "unattributed_blobs_txn",
    "unclaimed_blobs_txn",
]
