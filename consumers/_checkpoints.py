"""The checkpoint signer: a consumer that signs each run's chain head when it ends.

Agents never hold the signing key. This consumer follows every run's hash chain as its
events arrive (one stored head per run), and when ``run.finished`` extends a chain it
has verified from the first event, it signs run, tenant, last sequence and chain hash
with Ed25519. ``blackbox verify`` checks the log against that signature: a log rewritten
later, even consistently, no longer matches the signed head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, bindparam, text

from agent_blackbox.consumers._batch import BatchOutcome, Delivered
from agent_blackbox.consumers._runtime import ConsumerRuntime
from agent_blackbox.schemas import (
    GENESIS_CHAIN_HASH,
    Checkpoint,
    CheckpointSigner,
    EventType,
    Settings,
)

_HEADS = text(
    "SELECT run_id, last_sequence, chain_head, broken_at FROM blackbox_views.chain_heads "
    "WHERE run_id IN :run_ids FOR UPDATE"
).bindparams(bindparam("run_ids", expanding=True))
_SAVE_HEAD = text(
    """
    INSERT INTO blackbox_views.chain_heads (run_id, last_sequence, chain_head, broken_at)
    VALUES (:run_id, :last_sequence, :chain_head, :broken_at)
    ON CONFLICT (run_id) DO UPDATE
       SET last_sequence = EXCLUDED.last_sequence, chain_head = EXCLUDED.chain_head,
           broken_at = EXCLUDED.broken_at
    """
)
_SAVE_CHECKPOINT = text(
    """
    INSERT INTO blackbox_views.checkpoints
        (run_id, tenant_id, last_sequence, chain_head, signer_key_id, signature)
    VALUES (:run_id, :tenant_id, :last_sequence, :chain_head, :signer_key_id, :signature)
    ON CONFLICT (run_id) DO NOTHING
    """
)
_LOAD_CHECKPOINT = text(
    "SELECT run_id, tenant_id, last_sequence, chain_head, signer_key_id, signature "
    "FROM blackbox_views.checkpoints WHERE run_id = :run_id"
)


@dataclass
class _Head:
    last_sequence: int = 0
    chain_head: str = GENESIS_CHAIN_HASH
    broken_at: int | None = None
    """Where the chain stopped following: this run is never signed."""


def sign_batch(
    conn: Connection, records: Sequence[Delivered], *, signer: CheckpointSigner
) -> BatchOutcome:
    """Follow each run's chain through ``records``; sign the runs that ended soundly."""
    if not records:
        return BatchOutcome()
    by_run: dict[str, dict[int, Delivered]] = {}
    for record in records:
        by_run.setdefault(record.envelope.run_id, {}).setdefault(record.envelope.sequence, record)
    heads = {
        str(run_id): _Head(int(seq), str(head), broken)
        for run_id, seq, head, broken in conn.execute(_HEADS, {"run_ids": sorted(by_run)})
    }
    advanced = duplicates = broken = 0
    for run_id in sorted(by_run):
        head = heads.setdefault(run_id, _Head())
        for sequence in sorted(by_run[run_id]):
            envelope = by_run[run_id][sequence].envelope
            if head.broken_at is not None or sequence <= head.last_sequence:
                duplicates += 1
                continue
            expected = envelope.expected_chain_hash(head.chain_head)
            if sequence != head.last_sequence + 1 or envelope.chain_hash != expected:
                head.broken_at = sequence
                broken += 1
                continue
            head.last_sequence, head.chain_head = sequence, envelope.chain_hash
            advanced += 1
            if envelope.event_type == EventType.RUN_FINISHED:
                checkpoint = signer.sign(
                    run_id=run_id,
                    tenant_id=envelope.tenant_id,
                    last_sequence=sequence,
                    chain_head=envelope.chain_hash,
                )
                conn.execute(_SAVE_CHECKPOINT, checkpoint.to_record())
        conn.execute(
            _SAVE_HEAD,
            {
                "run_id": run_id,
                "last_sequence": head.last_sequence,
                "chain_head": head.chain_head,
                "broken_at": head.broken_at,
            },
        )
    return BatchOutcome(inserted=advanced, duplicates=duplicates, violations=broken)


def load_checkpoint(engine: Engine, run_id: str) -> Checkpoint | None:
    """The signed checkpoint of ``run_id``, if the signer has signed one."""
    with engine.connect() as conn:
        row = conn.execute(_LOAD_CHECKPOINT, {"run_id": run_id}).mappings().first()
    return None if row is None else Checkpoint.from_record(dict(row))


class CheckpointConsumer(ConsumerRuntime):
    """The consumer that signs chain heads, in its own consumer group.

    Call :func:`agent_blackbox.consumers.migrate_views` once before starting it.
    """

    def __init__(
        self,
        settings: Settings,
        signer: CheckpointSigner,
        *,
        group_id: str | None = None,
        engine: Engine | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(
            settings,
            partial(sign_batch, signer=signer),
            name="checkpoints",
            group_id=group_id or f"{settings.consumer_group}-checkpoints",
            engine=engine,
            registry=registry,
        )
