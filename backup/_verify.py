"""Checking a backup in its store: the manifest chain, and every object it names.

Nothing is trusted that was not checked: each manifest is read, numbered in order, names
its predecessor's SHA-256 and carries a known signer's signature; each segment's bytes
hash to what the manifest says and hold the offsets, count, runs and event-id digest
recorded for them; each snapshot table hashes right and decodes; each blob of the cut is
there and hashes to its content address.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from agent_blackbox.backup._chain import (
    Chain,
    ChainProblem,
    load_chain,
    manifest_numbers,
    read_manifest,
)
from agent_blackbox.backup._errors import BackupCorrupt
from agent_blackbox.backup._manifest import Manifest, SegmentEntry, TableEntry
from agent_blackbox.backup._pruned import load_pruned
from agent_blackbox.backup._segment import SegmentBuilder, decode_segment
from agent_blackbox.backup._snapshot import TABLES_BY_NAME, blob_key, decode_table
from agent_blackbox.backup._store import BackupStore, ObjectMissing, StoreError
from agent_blackbox.schemas import CheckpointVerifier, Envelope, EnvelopeCodec

Progress = Callable[[int, int], None]


@dataclass(slots=True)
class StoreCheck:
    """What checking a store found, up to its cut."""

    chain: Chain
    segments: int = 0
    messages: int = 0
    bytes: int = 0
    blobs: int = 0
    problems: list[ChainProblem] = field(default_factory=list)
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Run → (last sequence, chain hash) of its newest event up to the cut."""
    notes: list[Envelope] = field(default_factory=list)
    """The ``run.redacted`` notes up to the cut, in offset order per partition."""
    last_event_ms: int | None = None
    """The newest backed-up message's Kafka timestamp (ms since the epoch)."""
    pruned: set[str] = field(default_factory=set)
    """Segments a prune record says were removed on purpose (expired)."""
    waived: list[ChainProblem] = field(default_factory=list)
    """Problems the operator accepted by naming the cut to trust (newest manifests
    removed from the store): reported, not failed."""
    unchecked: list[str] = field(default_factory=list)
    """What could not be checked, and why (it fails nothing)."""

    def segments_held(self) -> list[SegmentEntry]:
        """The segments up to the cut that the store still holds (not pruned)."""
        every = (s for m in self.chain.manifests for s in m.segments)
        return [s for s in every if s.key not in self.pruned]

    @property
    def cut(self) -> Manifest | None:
        return self.chain.cut

    @property
    def passed(self) -> bool:
        return self.cut is not None and not self.problems


def check_store(
    store: BackupStore,
    verifier: CheckpointVerifier,
    *,
    at: datetime | None = None,
    upto: int | None = None,
    progress: Progress | None = None,
    recorded: Mapping[int, int] | None = None,
    trusted: bool = False,
) -> StoreCheck:
    """Check the chain up to the newest cut (or the last at or before ``at``, or the
    manifest numbered ``upto``) and every object it names; every problem is listed, none
    stops the check.

    ``recorded``: how far the database says the backup got (partition -> next offset);
    a store whose newest manifest is short of it had manifests removed from its end,
    whichever cut is checked. ``trusted``: the operator named the cut (``upto``), so
    that removal is reported in ``waived`` rather than failing the check.
    """
    chain = load_chain(store, verifier, at=at, upto=upto)
    pruned = load_pruned(store, verifier)
    check = StoreCheck(chain=chain, problems=[*chain.problems, *pruned.problems])
    check.pruned = pruned.segments
    if chain.cut is not None and chain.cut.number in pruned.cuts:
        check.problems.append(
            ChainProblem(chain.cut.key, "this cut was pruned (older than the retention horizon)")
        )
        return check  # its snapshot is gone on purpose: nothing more to find missing
    if chain.cut is None:
        if not check.problems:
            check.problems.append(ChainProblem(store.describe(), "no backup manifest is there"))
        return check
    if recorded:
        _check_tail(store, chain.cut, recorded, check, trusted=trusted)
    segments = check.segments_held()
    codec = EnvelopeCodec()
    for done, segment in enumerate(segments, 1):
        _check_segment(store, segment, codec, check)
        if progress is not None:
            progress(done, len(segments))
    _check_snapshot(store, chain.cut, check)
    return check


def _check_tail(
    store: BackupStore,
    cut: Manifest,
    recorded: Mapping[int, int],
    check: StoreCheck,
    *,
    trusted: bool,
) -> None:
    newest = _newest(store, cut)
    if newest is None:
        return  # unreadable: the chain check up to it names it
    short = {p: o for p, o in sorted(recorded.items()) if o > newest.positions.get(p, 0)}
    if not short:
        return
    where = ", ".join(f"[{p}]@{o}" for p, o in short.items())
    problem = ChainProblem(
        newest.key,
        f"the database records backing up to {where}, past this newest manifest: "
        "manifests after it were removed from the store; nothing is restored from it "
        "unless you name the cut to trust (--trust-cut <number>)",
    )
    (check.waived if trusted else check.problems).append(problem)


def _newest(store: BackupStore, cut: Manifest) -> Manifest | None:
    """The store's newest manifest (``cut`` when it is the newest)."""
    numbers = manifest_numbers(store)
    if not numbers or numbers[-1] == cut.number:
        return cut
    try:
        return read_manifest(store, numbers[-1])
    except (BackupCorrupt, StoreError):
        return None


def fetch_checked(store: BackupStore, key: str, sha256: str) -> bytes:
    """The object under ``key`` if its SHA-256 is ``sha256``.

    Raises:
        BackupCorrupt: it is missing or its bytes are not the ones the manifest names.
    """
    try:
        data = store.get(key)
    except ObjectMissing as exc:
        raise BackupCorrupt(f"object {key} is missing from {store.describe()}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise BackupCorrupt(
            f"object {key} is corrupt: its SHA-256 is {actual[:16]}…, the manifest says "
            f"{sha256[:16]}…"
        )
    return data


def _check_segment(
    store: BackupStore, segment: SegmentEntry, codec: EnvelopeCodec, check: StoreCheck
) -> None:
    try:
        data = fetch_checked(store, segment.key, segment.sha256)
        rebuilt = SegmentBuilder("", segment.partition, codec)
        for message in decode_segment(data, key=segment.key):
            rebuilt.add(message)
    except (BackupCorrupt, StoreError) as exc:
        check.problems.append(ChainProblem(segment.key, str(exc)))
        return
    check.segments += 1
    check.messages += len(rebuilt.messages)
    check.bytes += len(data)
    for run_id, head in rebuilt.heads.items():
        if run_id not in check.heads or head[0] > check.heads[run_id][0]:
            check.heads[run_id] = head
    check.notes.extend(rebuilt.notes)
    if rebuilt.messages:
        newest = max(m.timestamp_ms for m in rebuilt.messages)
        check.last_event_ms = max(check.last_event_ms or newest, newest)
    for problem in _segment_mismatches(segment, rebuilt):
        check.problems.append(ChainProblem(segment.key, problem))


def _segment_mismatches(segment: SegmentEntry, rebuilt: SegmentBuilder) -> list[str]:
    if not rebuilt.messages:
        return ["it holds no message"]
    found = {
        "count": len(rebuilt.messages),
        "first_offset": rebuilt.first_offset,
        "last_offset": rebuilt.last_offset,
        "event_digest": rebuilt.event_digest,
        "undecodable": rebuilt.undecodable,
    }
    problems = [
        f"its {name} is {value}, the manifest says {getattr(segment, name)}"
        for name, value in found.items()
        if getattr(segment, name) != value
    ]
    runs = {r.run_id: (r.first_sequence, r.last_sequence, r.count) for r in segment.runs}
    held = {
        run_id: (span.first_sequence, span.last_sequence, span.count)
        for run_id, span in rebuilt.runs.items()
    }
    if runs != held:
        differ = sorted(set(runs.items()) ^ set(held.items()))[:3]
        problems.append(f"its runs differ from the manifest's (e.g. {differ})")
    return problems


def _check_snapshot(store: BackupStore, cut: Manifest, check: StoreCheck) -> None:
    missing = set(TABLES_BY_NAME) - set(cut.snapshot.tables)
    if missing:
        check.problems.append(
            ChainProblem(cut.key, f"its snapshot lacks the tables {sorted(missing)}")
        )
    for name, entry in sorted(cut.snapshot.tables.items()):
        if name not in TABLES_BY_NAME:
            check.problems.append(ChainProblem(cut.key, f"its snapshot names table {name!r}"))
            continue
        try:
            rows = _table_rows(store, name, entry)
        except (BackupCorrupt, StoreError) as exc:
            check.problems.append(ChainProblem(entry.key, str(exc)))
            continue
        if name == "blobs":
            _check_blobs(store, [str(r["digest"]) for r in rows], check)


def _table_rows(store: BackupStore, name: str, entry: TableEntry) -> list[dict[str, object]]:
    data = fetch_checked(store, entry.key, entry.sha256)
    rows = list(decode_table(TABLES_BY_NAME[name], data, key=entry.key))
    if len(rows) != entry.rows:
        raise BackupCorrupt(
            f"object {entry.key} holds {len(rows)} rows, the manifest says {entry.rows}"
        )
    return rows


def _check_blobs(store: BackupStore, digests: list[str], check: StoreCheck) -> None:
    for digest in digests:
        try:
            fetch_blob(store, digest)
        except (BackupCorrupt, StoreError) as exc:
            check.problems.append(ChainProblem(blob_key(digest), str(exc)))
            continue
        check.blobs += 1


def fetch_blob(store: BackupStore, digest: str) -> bytes:
    """The body stored out of line under ``digest`` (``sha256:<hex>``), checked against it.

    Raises:
        BackupCorrupt: the digest is not a SHA-256, or the object is missing or not it.
    """
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256":
        raise BackupCorrupt(f"blob {digest!r} is not named by a SHA-256")
    return fetch_checked(store, blob_key(digest), hexdigest)
