"""Whose bodies stored out of line are: each ``blackbox.blobs`` row names a tenant, and a
replayer reads (through ``blackbox.read_blob``) the copies of its granted tenants only.

Bodies stored before bodies had a tenant are :data:`UNATTRIBUTED` (no grant reaches
them; the owner reads them). :func:`attribute_blobs_txn` gives a tenant its copy of
such a body for events of its runs up to the head each run had when bodies got tenants
(``blackbox.blob_tenancy_heads``): the caller proves those events by their chain, read
from the topic (see ``blackbox migrate``)"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, text

UNATTRIBUTED = ""
"""The tenant of a body stored before bodies had one: readable by the owner only."""

_UNATTRIBUTED = text(
    "SELECT b.digest FROM blackbox.blobs b WHERE b.tenant_id = :none ORDER BY b.digest"
).bindparams(none=UNATTRIBUTED)
_UNCLAIMED = text(
    "SELECT count(*) FROM blackbox.blobs b WHERE b.tenant_id = :none AND NOT EXISTS "
    "(SELECT 1 FROM blackbox.blobs o WHERE o.digest = b.digest AND o.tenant_id <> :none)"
).bindparams(none=UNATTRIBUTED)
_HEADS = text(
    "SELECT run_id, last_sequence, chain_head FROM blackbox.blob_tenancy_heads "
    "WHERE run_id = ANY(CAST(:runs AS text[]))"
)
_REMEMBER_HEADS = text(
    "INSERT INTO blackbox.blob_tenancy_heads (run_id, last_sequence, chain_head) "
    "SELECT run_id, last_sequence, chain_head FROM blackbox.runs "
    "ON CONFLICT (run_id) DO NOTHING"
)
# The owner's copy stays: a run naming the body that does not qualify yet (its views not
# caught up) may still give its tenant a copy later.
_ATTRIBUTE = text(
    """
    WITH named AS (
        SELECT n.run_id, n.sequence, n.digest
          FROM unnest(CAST(:runs AS text[]), CAST(:sequences AS bigint[]),
                      CAST(:refs AS text[])) AS n(run_id, sequence, digest)),
    owners AS (
        SELECT DISTINCT n.digest, r.tenant_id FROM named n
          JOIN blackbox.blob_tenancy_heads h
            ON h.run_id = n.run_id AND n.sequence <= h.last_sequence
          JOIN blackbox.runs r ON r.run_id = n.run_id)
    INSERT INTO blackbox.blobs (digest, tenant_id, data, size, created_at)
    SELECT o.digest, o.tenant_id, b.data, b.size, b.created_at
      FROM owners o JOIN blackbox.blobs b ON b.digest = o.digest AND b.tenant_id = :none
    ON CONFLICT (digest, tenant_id) DO NOTHING
    """
).bindparams(none=UNATTRIBUTED)


def unattributed_blobs_txn(conn: Connection) -> list[str]:
    """The digests of the bodies stored before bodies had a tenant (the owner's copies)."""
    return [str(digest) for digest in conn.execute(_UNATTRIBUTED).scalars()]


def unclaimed_blobs_txn(conn: Connection) -> int:
    """How many bodies stored before bodies had a tenant no tenant has a copy of."""
    return int(conn.execute(_UNCLAIMED).scalar_one())


def tenancy_heads_txn(conn: Connection, run_ids: Sequence[str]) -> dict[str, tuple[int, str]]:
    """The last sequence and chain head each of ``run_ids`` had when bodies got tenants
    (absent: a run started since, which can claim no older body)."""
    rows = conn.execute(_HEADS, {"runs": list(run_ids)})
    return {str(run): (int(last), str(head)) for run, last, head in rows}


def remember_tenancy_heads_txn(conn: Connection) -> None:
    """Take every run's head as it is as the one it had when bodies got tenants: for a
    restore of a backup cut from before then, whose runs and bodies come back together."""
    conn.execute(_REMEMBER_HEADS)


def attribute_blobs_txn(conn: Connection, named: Iterable[tuple[str, int, str]]) -> int:
    """Give the tenant of each run in ``named`` (``(run_id, sequence, digest)`` of events
    that refer to a body stored before bodies had a tenant, which the caller proved by
    their chain) its copy of the body, where the event is within the run's head of
    then. The owner's copy stays. How many copies were made.
    """
    rows: Sequence[tuple[str, int, str]] = list(named)
    if not rows:
        return 0
    runs, sequences, refs = zip(*rows, strict=True)
    params = {"runs": list(runs), "sequences": list(sequences), "refs": list(refs)}
    return int(conn.execute(_ATTRIBUTE, params).rowcount)
