"""The statement the retention job signs when it destroys a run's data keys.

A ``run.redacted`` note in the topic is what ``blackbox ledger reapply`` acts on after a
database restore, and anyone with produce access to the topic can write one. The job
therefore signs each note with the signer's Ed25519 key (the one that signs
checkpoints); re-application trusts a note only when that signature verifies (or the
database's own ledger already records the destruction). The statement binds run,
tenant, sequence, key ids, reason, subject and retention class, under its own
``purpose``, so it can be neither moved to another run nor mistaken for a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DELETION_PURPOSE = "agent-blackbox deletion v1"
"""Bound into every signed deletion statement."""

REDACTED_SIGNED_VERSION = 2
"""The ``run.redacted`` body version that carries ``signer_key_id`` and ``signature``."""


def deletion_statement(
    *,
    run_id: str,
    tenant_id: str,
    sequence: int,
    key_ids: Iterable[str],
    reason: str,
    subject_id: str | None,
    retention_class: str | None,
) -> dict[str, Any]:
    """What the retention job signs for the ``run.redacted`` at ``sequence`` of ``run_id``
    (canonical JSON of this mapping is the signed message)."""
    return {
        "purpose": DELETION_PURPOSE,
        "run_id": run_id,
        "tenant_id": tenant_id,
        "sequence": sequence,
        "key_ids": sorted(key_ids),
        "reason": reason,
        "subject_id": subject_id,
        "retention_class": retention_class,
    }
