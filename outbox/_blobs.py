"""Whose bodies stored out of line are: each ``blackbox.blobs`` row names a tenant, and a
replayer reads (through ``blackbox.read_blob``) the copies of its granted tenants only.

Bodies stored before bodies had a tenant are :data:`UNATTRIBUTED` (no grant reaches
them; the owner reads them). :func:`attribute_blobs_txn` gives each to the tenants of
the runs whose events name it, as the views index them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, text

UNATTRIBUTED = ""
"""The tenant of a body stored before bodies had one: readable by the owner only."""

_UNATTRIBUTED = text(
    "SELECT digest FROM blackbox.blobs WHERE tenant_id = :none ORDER BY digest"
).bindparams(none=UNATTRIBUTED)
# One statement: every sub-statement sees the rows as they were before it, so the copies
# are taken from the unattributed rows the same statement then removes. A run may claim a
# body only with an event the write side holds (its sequence within the run's) and only
# if nothing was appended to it since bodies got tenants: every body such a run names was
# stored before then, while a run written to since could name a digest it learned later.
_ATTRIBUTE = text(
    """
    WITH named AS (
        SELECT n.run_id, n.sequence, n.digest
          FROM unnest(CAST(:runs AS text[]), CAST(:sequences AS bigint[]),
                      CAST(:refs AS text[])) AS n(run_id, sequence, digest)),
    owners AS (
        SELECT DISTINCT n.digest, r.tenant_id FROM named n
          JOIN blackbox.runs r ON r.run_id = n.run_id AND n.sequence <= r.last_sequence
         WHERE r.updated_at <= (SELECT min(t.since) FROM blackbox.blob_tenancy t)),
    copied AS (
        INSERT INTO blackbox.blobs (digest, tenant_id, data, size, created_at)
        SELECT o.digest, o.tenant_id, b.data, b.size, b.created_at
          FROM owners o JOIN blackbox.blobs b ON b.digest = o.digest AND b.tenant_id = :none
        ON CONFLICT (digest, tenant_id) DO NOTHING)
    DELETE FROM blackbox.blobs b
     WHERE b.tenant_id = :none AND b.digest IN (SELECT digest FROM owners)
    """
).bindparams(none=UNATTRIBUTED)


def unattributed_blobs_txn(conn: Connection) -> list[str]:
    """The digests of the bodies no tenant owns yet (stored before bodies had one)."""
    return [str(digest) for digest in conn.execute(_UNATTRIBUTED).scalars()]


def attribute_blobs_txn(conn: Connection, named: Iterable[tuple[str, int, str]]) -> int:
    """Give each unattributed body to the tenant of every run that names it: ``named``
    holds ``(run_id, sequence, digest)`` of the events that refer to a body (those the
    views vouch for). Only a run the write side holds with that event, and to which
    nothing was appended since bodies got tenants, gives its tenant a body. How many
    bodies were attributed.
    """
    rows: Sequence[tuple[str, int, str]] = list(named)
    if not rows:
        return 0
    runs, sequences, refs = zip(*rows, strict=True)
    params = {"runs": list(runs), "sequences": list(sequences), "refs": list(refs)}
    return int(conn.execute(_ATTRIBUTE, params).rowcount)
