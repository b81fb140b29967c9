"""Writing one backup cut to the store: its event segments, then the database snapshot,
then the signed manifest that names them (see :mod:`._writer` for why in that order)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.backup._errors import BackupError, first_line
from agent_blackbox.backup._manifest import GENESIS_MANIFEST, Manifest, SegmentEntry, SnapshotEntry
from agent_blackbox.backup._manifest import RunRange as ManifestRun
from agent_blackbox.backup._pending import PendingCut
from agent_blackbox.backup._segment import SegmentBuilder
from agent_blackbox.backup._snapshot import SnapshotTaker
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.schemas import CheckpointSigner

EVENTS = "events/"


class CutWriter:
    """Writes cuts of one topic to one store.

    Args:
        store: where the cut goes.
        signer: the checkpoint signer's key, which signs each manifest.
        snapshots: takes the database snapshot of each cut.
        topic: the topic backed up.
    """

    def __init__(
        self,
        store: BackupStore,
        *,
        signer: CheckpointSigner,
        snapshots: SnapshotTaker,
        topic: str,
    ) -> None:
        self._store = store
        self._signer = signer
        self._snapshots = snapshots
        self._topic = topic
        self._uploaded: set[str] = set()
        """Segments stored for the cut under way: a retry after a failure (the store
        away, say) does not upload them again."""

    def write(self, pending: PendingCut, *, after: Manifest | None) -> Manifest:
        """Write ``pending``'s segments, the snapshot and the manifest that follows
        ``after`` in the chain; the manifest written.

        Raises:
            StoreError, BackupError: the store or the database failed; the chain names
                nothing written so far.
        """
        segments = [self._write_segment(b) for b in pending.segments()]
        snapshot = self._snapshot()
        manifest = Manifest(
            number=1 if after is None else after.number + 1,
            previous=GENESIS_MANIFEST if after is None else after.digest,
            topic=self._topic,
            created_at=datetime.now(UTC).isoformat(),
            segments=tuple(segments),
            positions=dict(pending.read),
            snapshot=snapshot,
            lost=tuple(pending.lost),
        ).signed(self._signer)
        self._store.put(manifest.key, manifest.to_bytes())
        self._uploaded.clear()
        return manifest

    def _write_segment(self, builder: SegmentBuilder) -> SegmentEntry:
        data = builder.encode()
        digest = hashlib.sha256(data).hexdigest()
        key = f"{EVENTS}p{builder.partition:04d}/{builder.first_offset:020d}-{digest}.avro"
        if key not in self._uploaded:
            self._store.put(key, data)
            self._uploaded.add(key)
        return SegmentEntry(
            key=key,
            sha256=digest,
            size=len(data),
            partition=builder.partition,
            first_offset=builder.first_offset,
            last_offset=builder.last_offset,
            count=len(builder.messages),
            first_timestamp_ms=builder.messages[0].timestamp_ms,
            last_timestamp_ms=builder.messages[-1].timestamp_ms,
            event_digest=builder.event_digest,
            undecodable=builder.undecodable,
            runs=tuple(
                ManifestRun(run_id, span.first_sequence, span.last_sequence, span.count)
                for run_id, span in sorted(builder.runs.items())
            ),
        )

    def _snapshot(self) -> SnapshotEntry:
        try:
            return self._snapshots.take()
        except SQLAlchemyError as exc:
            raise BackupError(
                f"cannot take the database snapshot: {first_line(exc)}; check that the database is "
                "reachable and the backup's role may read the write side"
            ) from exc
