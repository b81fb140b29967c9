"""The checkpoint signer: a consumer that signs run heads the database vouches for.

Agents never hold the signing key. This consumer follows every run's hash chain as its
events arrive (one stored head per run) and signs run, tenant, last sequence, chain
hash and whether the run had finished with Ed25519, but only when ``blackbox.runs`` (the
write side's source of truth, read through
:func:`agent_blackbox.outbox.storage.run_heads_txn`) holds exactly that head: a run the
database does not know, or a topic head it never committed, is refused and recorded in
``integrity_violations`` (with a log line and the consumer's violations metric), never
signed. A run is signed when it ends, and while it runs every ``every_events`` events
or ``every_seconds`` (mid-run checkpoints), so long and crashed runs are covered too.
``blackbox verify`` checks the log against the latest signature: a log rewritten later,
even consistently, no longer matches the signed head.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects import postgresql as pg

from agent_blackbox.consumers._batch import BatchOutcome, Delivered
from agent_blackbox.consumers._runtime import ConsumerRuntime
from agent_blackbox.consumers._signing import (
    ChainHead,
    CheckpointPolicy,
    SignerFinding,
    Step,
    Verdict,
    conflicts,
    follow,
    judge,
)
from agent_blackbox.consumers._tables import integrity_violations
from agent_blackbox.outbox.storage import RunHead, run_heads_txn
from agent_blackbox.schemas import Checkpoint, CheckpointSigner, Envelope, Settings, safe_text

log = logging.getLogger(__name__)

_COLUMNS = (
    "run_id, tenant_id, last_sequence, chain_head, broken_at, finished, sealed, "
    "signed_sequence, check_after"
)
_HEADS = text(
    f"SELECT {_COLUMNS} FROM blackbox_views.chain_heads WHERE run_id IN :run_ids FOR UPDATE"
).bindparams(bindparam("run_ids", expanding=True))
_DUE = text(
    f"""
    SELECT {_COLUMNS} FROM blackbox_views.chain_heads
     WHERE check_after IS NOT NULL AND broken_at IS NULL AND check_after <= :now
     ORDER BY check_after LIMIT :limit FOR UPDATE SKIP LOCKED
    """
)
_SAVE_HEAD = text(
    f"""
    INSERT INTO blackbox_views.chain_heads ({_COLUMNS})
    VALUES (:run_id, :tenant_id, :last_sequence, :chain_head, :broken_at, :finished, :sealed,
            :signed_sequence, :check_after)
    ON CONFLICT (run_id) DO UPDATE
       SET tenant_id = EXCLUDED.tenant_id, last_sequence = EXCLUDED.last_sequence,
           chain_head = EXCLUDED.chain_head, broken_at = EXCLUDED.broken_at,
           finished = EXCLUDED.finished, sealed = EXCLUDED.sealed,
           signed_sequence = EXCLUDED.signed_sequence, check_after = EXCLUDED.check_after
    """
)
# One row per run: the latest signed head. A run's head only grows, and the signer
# signs a sequence at most once, so a newer checkpoint replaces an older one.
_SAVE_CHECKPOINT = text(
    """
    INSERT INTO blackbox_views.checkpoints
        (run_id, tenant_id, last_sequence, chain_head, signer_key_id, signature, finished)
    VALUES (:run_id, :tenant_id, :last_sequence, :chain_head, :signer_key_id, :signature,
            :finished)
    ON CONFLICT (run_id) DO UPDATE
       SET tenant_id = EXCLUDED.tenant_id, last_sequence = EXCLUDED.last_sequence,
           chain_head = EXCLUDED.chain_head, signer_key_id = EXCLUDED.signer_key_id,
           signature = EXCLUDED.signature, finished = EXCLUDED.finished, signed_at = now()
     WHERE blackbox_views.checkpoints.last_sequence < EXCLUDED.last_sequence
    """
)
_LOAD_CHECKPOINT = text(
    "SELECT run_id, tenant_id, last_sequence, chain_head, signer_key_id, signature, finished "
    "FROM blackbox_views.checkpoints WHERE run_id = :run_id"
)
# The events index (built by the views consumer) knows the event that came first at a
# run and sequence; a repeat below the signer's head is compared with it.
_INDEXED = text(
    """
    SELECT run_id, sequence, event_id, input_digest, output_digest, chain_hash
      FROM blackbox_views.events
     WHERE (run_id, sequence) IN (SELECT * FROM unnest(CAST(:runs AS text[]),
                                                      CAST(:sequences AS bigint[])))
    """
)
_SWEEP_LIMIT = 500


@dataclass(frozen=True, slots=True)
class _Flag:
    """An integrity finding, as one ``integrity_violations`` row."""

    kind: SignerFinding
    run_id: str
    sequence: int
    detail: str
    incoming: Delivered | None = None
    existing: tuple[str, str, str] = ("", "", "")
    """The known event's input digest, output digest and chain hash."""


@dataclass(slots=True)
class _Batch:
    """One transaction's work: the heads it holds locked and what it found."""

    conn: Connection
    signer: CheckpointSigner
    policy: CheckpointPolicy
    now: datetime
    heads: dict[str, ChainHead]
    flags: list[_Flag] = field(default_factory=list)
    signed: int = 0


def sign_batch(
    conn: Connection,
    records: Sequence[Delivered],
    *,
    signer: CheckpointSigner,
    policy: CheckpointPolicy | None = None,
    clock: Callable[[], datetime] | None = None,
) -> BatchOutcome:
    """Follow each run's chain through ``records``; sign the heads the database vouches for.

    1. Lock the stored heads of the runs in the batch.
    2. Follow each run's events in sequence order; a repeat that differs from the event
       known at its sequence is a conflicting duplicate, a link that does not chain or
       a plaintext body after a sealed one stops the run being followed.
    3. Compare every touched head with ``blackbox.runs``: refuse, wait, or sign.
    4. Record the findings, save the heads.
    """
    if not records:
        return BatchOutcome()
    now = (clock or _utc_now)()
    by_run: dict[str, list[Delivered]] = {}
    for record in sorted(records, key=lambda r: (r.envelope.sequence, r.partition, r.offset)):
        by_run.setdefault(record.envelope.run_id, []).append(record)
    batch = _Batch(conn, signer, policy or CheckpointPolicy(), now, _load_heads(conn, by_run))
    advanced, ignored, unresolved = _follow_all(batch, by_run)
    repeats = _repeats(batch, unresolved)
    latest = {run_id: delivered[-1] for run_id, delivered in by_run.items()}
    _settle(batch, sorted(by_run), latest=latest)
    _finish(batch)
    duplicates = len(repeats) + ignored
    return BatchOutcome(inserted=advanced, duplicates=duplicates, violations=len(batch.flags))


def sweep_heads(
    conn: Connection,
    *,
    signer: CheckpointSigner,
    policy: CheckpointPolicy,
    now: datetime | None = None,
    limit: int = _SWEEP_LIMIT,
) -> BatchOutcome:
    """Sign the idle heads whose wait ran out (a run that crashed, or waits, gets its
    mid-run checkpoint here: no later event of it will arrive to trigger one).

    Returns:
        ``inserted``: heads signed; ``violations``: heads refused.
    """
    now = now or _utc_now()
    rows = conn.execute(_DUE, {"now": now, "limit": limit})
    heads = {head.run_id: head for head in map(_head_of, rows)}
    batch = _Batch(conn, signer, policy, now, heads)
    _settle(batch, sorted(heads), latest={}, sweep=True)
    _finish(batch)
    return BatchOutcome(inserted=batch.signed, violations=len(batch.flags))


def load_checkpoint(engine: Engine, run_id: str) -> Checkpoint | None:
    """The latest signed checkpoint of ``run_id``, if the signer has signed one."""
    with engine.connect() as conn:
        row = conn.execute(_LOAD_CHECKPOINT, {"run_id": run_id}).mappings().first()
    return None if row is None else Checkpoint.from_record(dict(row))


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _load_heads(conn: Connection, by_run: dict[str, list[Delivered]]) -> dict[str, ChainHead]:
    rows = conn.execute(_HEADS, {"run_ids": sorted(by_run)})
    return {head.run_id: head for head in map(_head_of, rows)}


def _head_of(row: Any) -> ChainHead:
    run_id, tenant, last, chain, broken, finished, sealed, signed, check_after = row
    return ChainHead(
        str(run_id),
        None if tenant is None else str(tenant),
        int(last),
        str(chain),
        None if broken is None else int(broken),
        bool(finished),
        bool(sealed),
        int(signed),
        check_after,
    )


def _follow_all(
    batch: _Batch, by_run: dict[str, list[Delivered]]
) -> tuple[int, int, list[tuple[Delivered, Envelope | None]]]:
    """Step 2: the links followed, the events of refused runs (ignored), and the repeats
    with the event followed at their sequence in this batch, if one was."""
    advanced = ignored = 0
    repeats: list[tuple[Delivered, Envelope | None]] = []
    for run_id, delivered in sorted(by_run.items()):
        head = batch.heads.setdefault(run_id, ChainHead(run_id))
        seen: dict[int, Envelope] = {}
        for record in delivered:
            envelope = record.envelope
            step = follow(head, envelope)
            if step is Step.ADVANCED:
                advanced += 1
                seen[envelope.sequence] = envelope
                if head.check_after is None:
                    head.check_after = batch.now + batch.policy.wait
            elif step is Step.REPEAT:
                repeats.append((record, seen.get(envelope.sequence)))
            elif step is Step.BROKEN:
                batch.flags.append(_broken(record, head))
            elif step is Step.PLAINTEXT:
                batch.flags.append(_plaintext(record))
            else:
                ignored += 1
    return advanced, ignored, repeats


def _repeats(batch: _Batch, unresolved: list[tuple[Delivered, Envelope | None]]) -> list[Delivered]:
    """Sort the repeats into redeliveries (returned) and conflicting duplicates (flagged):
    against the event followed in this batch, the stored head, or the events index."""
    repeats: list[Delivered] = []
    lookup = [record for record, known in unresolved if known is None]
    indexed = _indexed(batch.conn, lookup)
    for record, known in unresolved:
        envelope = record.envelope
        head = batch.heads[envelope.run_id]
        existing: tuple[str | None, str, str, str]
        if known is not None:
            existing = (known.event_id, known.chain_hash, known.input_digest, known.output_digest)
        elif (found := indexed.get((envelope.run_id, envelope.sequence))) is not None:
            existing = found
        elif envelope.sequence == head.last_sequence:
            existing = (None, head.chain_head, "", "")
        else:
            repeats.append(record)  # nothing known to compare with: counted as a repeat
            continue
        event_id, chain, input_digest, output_digest = existing
        if conflicts(event_id, chain, envelope):
            batch.flags.append(_conflict(record, event_id, (input_digest, output_digest, chain)))
        else:
            repeats.append(record)
    return repeats


def _indexed(
    conn: Connection, records: Iterable[Delivered]
) -> dict[tuple[str, int], tuple[str | None, str, str, str]]:
    keys = sorted({r.key for r in records})
    if not keys:
        return {}
    params = {"runs": [k[0] for k in keys], "sequences": [k[1] for k in keys]}
    return {
        (str(run_id), int(seq)): (str(event_id), str(chain), str(i), str(o))
        for run_id, seq, event_id, i, o, chain in conn.execute(_INDEXED, params)
    }


def _settle(
    batch: _Batch, run_ids: list[str], *, latest: dict[str, Delivered], sweep: bool = False
) -> None:
    """Step 3: compare each head with the database's and act on the verdict."""
    stored = run_heads_txn(batch.conn, [r for r in run_ids if batch.heads[r].unsigned])
    for run_id in run_ids:
        head = batch.heads[run_id]
        if not head.unsigned:
            continue
        known = stored.get(run_id)
        if head.tenant_id is None and known is not None:
            # A head the first signer stored has no tenant; the chain hash binds every
            # event's tenant, so a head equal to the database's is of the database's.
            head.tenant_id = known.tenant_id
        verdict = judge(head, known, policy=batch.policy, now=batch.now, sweep=sweep)
        if verdict.finding is not None:
            head.broken_at = head.last_sequence
            head.check_after = None
            batch.flags.append(_refused(head, verdict, latest.get(run_id), known))
        elif verdict.sign:
            _sign(batch, head, finished=verdict.finished)
        elif sweep:
            head.check_after = batch.now + batch.policy.wait  # the database knows more: later


def _sign(batch: _Batch, head: ChainHead, *, finished: bool) -> None:
    assert head.tenant_id is not None  # a followed head has a tenant
    checkpoint = batch.signer.sign(
        run_id=head.run_id,
        tenant_id=head.tenant_id,
        last_sequence=head.last_sequence,
        chain_head=head.chain_head,
        finished=finished,
    )
    batch.conn.execute(_SAVE_CHECKPOINT, checkpoint.to_record())
    head.signed_sequence = head.last_sequence
    head.check_after = None
    batch.signed += 1


def _finish(batch: _Batch) -> None:
    """Step 4."""
    if batch.flags:
        for flag in batch.flags:
            log.warning(
                "integrity violation (%s): run %s sequence %d not signed: %s",
                flag.kind,
                safe_text(flag.run_id, limit=80),
                flag.sequence,
                flag.detail,
            )
        statement = pg.insert(integrity_violations).on_conflict_do_nothing()
        batch.conn.execute(statement, [_row(flag) for flag in batch.flags])
    if batch.heads:
        batch.conn.execute(_SAVE_HEAD, [_head_row(h) for h in batch.heads.values()])


def _head_row(head: ChainHead) -> dict[str, Any]:
    return {
        "run_id": head.run_id,
        "tenant_id": head.tenant_id,
        "last_sequence": head.last_sequence,
        "chain_head": head.chain_head,
        "broken_at": head.broken_at,
        "finished": head.finished,
        "sealed": head.sealed,
        "signed_sequence": head.signed_sequence,
        "check_after": head.check_after,
    }


def _broken(record: Delivered, head: ChainHead) -> _Flag:
    envelope = record.envelope
    return _Flag(
        SignerFinding.BROKEN_CHAIN,
        envelope.run_id,
        envelope.sequence,
        f"event {envelope.sequence} does not continue the chain followed up to sequence "
        f"{head.last_sequence}; the run is no longer signed",
        record,
        ("", "", head.chain_head),
    )


def _plaintext(record: Delivered) -> _Flag:
    envelope = record.envelope
    return _Flag(
        SignerFinding.PLAINTEXT_IN_SEALED_RUN,
        envelope.run_id,
        envelope.sequence,
        f"event {envelope.sequence} ({safe_text(envelope.event_type, limit=40)}) carries a "
        "plaintext body in a run sealed with a data key",
        record,
    )


def _conflict(record: Delivered, event_id: str | None, existing: tuple[str, str, str]) -> _Flag:
    envelope = record.envelope
    known = "" if event_id is None else f" (event {safe_text(event_id, limit=40)})"
    return _Flag(
        SignerFinding.CONFLICTING_DUPLICATE,
        envelope.run_id,
        envelope.sequence,
        f"event {safe_text(envelope.event_id, limit=40)} at sequence {envelope.sequence} "
        f"conflicts with the event known there{known}: another event id or chain hash",
        record,
        existing,
    )


def _refused(
    head: ChainHead, verdict: Verdict, record: Delivered | None, stored: RunHead | None
) -> _Flag:
    assert verdict.finding is not None
    return _Flag(
        verdict.finding,
        head.run_id,
        head.last_sequence,
        verdict.detail,
        record,
        ("", "", "" if stored is None else stored.chain_head),
    )


def _row(flag: _Flag) -> dict[str, Any]:
    """An ``integrity_violations`` row; a head refused by the sweep has no delivered
    event, so its location is empty (topic ``''``, partition and offset -1)."""
    existing_in, existing_out, existing_chain = flag.existing
    record = flag.incoming
    envelope = None if record is None else record.envelope
    return {
        "kind": str(flag.kind),
        "run_id": flag.run_id,
        "sequence": flag.sequence,
        "event_id": "" if envelope is None else envelope.event_id,
        "existing_input_digest": existing_in,
        "existing_output_digest": existing_out,
        "existing_chain_hash": existing_chain,
        "incoming_input_digest": "" if envelope is None else envelope.input_digest,
        "incoming_output_digest": "" if envelope is None else envelope.output_digest,
        "incoming_chain_hash": "" if envelope is None else envelope.chain_hash,
        "topic": "" if record is None else record.topic,
        "partition": -1 if record is None else record.partition,
        "offset": -1 if record is None else record.offset,
    }


class CheckpointConsumer(ConsumerRuntime):
    """The consumer that signs chain heads, in its own consumer group.

    Its database user writes the views' signer tables and reads ``blackbox.runs`` for
    every tenant (a member of ``blackbox_reader`` granted tenant ``*`` can). Call
    :func:`agent_blackbox.consumers.migrate_views` once before starting it.

    Args:
        policy: when running runs are signed mid-run; defaults to the settings'.
    """

    def __init__(
        self,
        settings: Settings,
        signer: CheckpointSigner,
        *,
        group_id: str | None = None,
        engine: Engine | None = None,
        registry: CollectorRegistry | None = None,
        policy: CheckpointPolicy | None = None,
        instance_id: str | None = None,
    ) -> None:
        self._policy = policy or CheckpointPolicy.from_settings(settings)
        self._signer = signer
        super().__init__(
            settings,
            partial(sign_batch, signer=signer, policy=self._policy),
            name="checkpoints",
            group_id=group_id or f"{settings.consumer_group}-checkpoints",
            engine=engine,
            registry=registry,
            instance_id=instance_id,
        )
        self._next_sweep = 0.0

    def _between_batches(self) -> None:
        """When due, sign idle heads whose wait ran out (see :func:`sweep_heads`)."""
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + min(self._policy.every_seconds, 10.0) / 2
            with self._database.transaction() as conn:
                swept = sweep_heads(conn, signer=self._signer, policy=self._policy)
            self._metrics.violations_found(swept.violations)
