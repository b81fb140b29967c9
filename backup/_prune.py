"""Expiry of old backup objects, following the retention classes.

The retention job deletes a run's metadata from production once its class's metadata
period passed; a backup keeps it no longer than that:

- an event segment expires once every run it holds is gone from production (absent from
  the newest cut's ``runs``) and its newest event is older than the shortest metadata
  period of any class (no run of any class outlives that in production);
- a cut expires once it is older than the longest metadata period, except the newest;
  its snapshot objects go when no remaining cut names them;
- a blob goes when no remaining cut's blob list names it.

Manifests stay (they are small, and the chain runs through them). What was removed is
written first, as a prune record signed with the checkpoint key (``pruned/<n>.json``), so
a check knows an object is gone on purpose, and a prune interrupted half way leaves
nothing a check would call missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from agent_blackbox.backup._chain import load_chain
from agent_blackbox.backup._errors import BackupError
from agent_blackbox.backup._manifest import Manifest, SegmentEntry
from agent_blackbox.backup._pruned import PRUNED, PruneRecord, load_pruned
from agent_blackbox.backup._restore import table_rows
from agent_blackbox.backup._snapshot import BLOBS, blob_key
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._trust import no_cut
from agent_blackbox.consumers import RetentionPolicy
from agent_blackbox.schemas import CheckpointSigner, CheckpointVerifier


@dataclass(slots=True)
class PrunePlan:
    """What a prune would remove."""

    segments: list[SegmentEntry] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    """Every key to delete: the segments, and snapshot tables and blobs no cut needs."""

    @property
    def empty(self) -> bool:
        return not self.objects and not self.cuts


def plan_prune(
    store: BackupStore,
    verifier: CheckpointVerifier,
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
) -> PrunePlan:
    """What has expired (see the module).

    Raises:
        BackupError: the chain or the prune records are not sound (nothing is pruned
            from a backup that fails its check).
    """
    now = now or datetime.now(UTC)
    chain = load_chain(store, verifier)
    pruned = load_pruned(store, verifier)
    if chain.cut is None and not chain.problems:
        raise BackupError(no_cut(store, None))
    if chain.problems or pruned.problems or chain.cut is None:
        found = "; ".join(f"{p.where}: {p.problem}" for p in [*chain.problems, *pruned.problems])
        raise BackupError(f"the backup is not sound, nothing is pruned: {found or 'no cut'}")
    newest = chain.cut
    periods = [c.metadata for c in policy.classes.values()]
    segment_horizon = now - min(periods)
    cut_horizon = now - max(periods)
    alive = {str(r["run_id"]) for r in table_rows(store, newest, "runs")}
    plan = PrunePlan()
    for manifest in chain.manifests:
        for segment in manifest.segments:
            if segment.key not in pruned.segments and _expired(segment, alive, segment_horizon):
                plan.segments.append(segment)
    kept = [
        m
        for m in chain.manifests
        if m is newest or (m.number not in pruned.cuts and _created(m) >= cut_horizon)
    ]
    plan.cuts = [m.number for m in chain.manifests if m not in kept and m.number not in pruned.cuts]
    plan.objects = [s.key for s in plan.segments]
    plan.objects += _unreferenced_tables(store, chain.manifests, kept)
    plan.objects += _unreferenced_blobs(store, kept)
    return plan


def prune(store: BackupStore, signer: CheckpointSigner, plan: PrunePlan) -> PruneRecord | None:
    """Record ``plan`` (signed), then delete its objects; None when there was nothing."""
    if plan.empty:
        return None
    numbers = [int(k[len(PRUNED) : -len(".json")]) for k in store.keys(PRUNED)]
    record = PruneRecord(
        number=max(numbers, default=0) + 1,
        created_at=datetime.now(UTC).isoformat(),
        segments=tuple(s.key for s in plan.segments),
        cuts=tuple(plan.cuts),
    ).signed(signer)
    store.put(record.key, record.to_bytes())
    for key in plan.objects:
        store.delete(key)
    return record


def _expired(segment: SegmentEntry, alive: set[str], horizon: datetime) -> bool:
    newest = datetime.fromtimestamp(segment.last_timestamp_ms / 1000, UTC)
    return newest < horizon and not any(r.run_id in alive for r in segment.runs)


def _created(manifest: Manifest) -> datetime:
    return datetime.fromisoformat(manifest.created_at)


def _unreferenced_tables(
    store: BackupStore, manifests: Iterable[Manifest], kept: Iterable[Manifest]
) -> list[str]:
    needed = {t.key for m in kept for t in m.snapshot.tables.values()}
    every = {t.key for m in manifests for t in m.snapshot.tables.values()}
    present = set(store.keys("snapshots/"))
    return sorted((every - needed) & present)


def _unreferenced_blobs(store: BackupStore, kept: Iterable[Manifest]) -> list[str]:
    needed: set[str] = set()
    seen: set[str] = set()
    for manifest in kept:
        table = manifest.snapshot.tables.get("blobs")
        if table is None or table.key in seen:
            continue
        seen.add(table.key)
        needed.update(blob_key(str(r["digest"])) for r in table_rows(store, manifest, "blobs"))
    return sorted(k for k in store.keys(BLOBS) if k not in needed)


def horizon_note(policy: RetentionPolicy) -> str:
    """How long segments and cuts are kept under ``policy``, for people."""
    periods: list[timedelta] = [c.metadata for c in policy.classes.values()]
    return (
        f"expiring segments of runs production deleted, once older than {min(periods).days} "
        f"days, and cuts older than {max(periods).days} days (never the newest)"
    )
