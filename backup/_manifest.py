"""Manifests: what each backup step wrote, hash-chained and signed.

Every step of the backup ends with one manifest naming the event segments it wrote (with
what is in each), the database snapshot it took after them, and where each partition's
backup now stands. A manifest names the SHA-256 of the one before it and is signed with
the checkpoint signer's key, so a restore can prove it holds an unbroken, genuine series
of backups and that every object is the one that was written.

Manifests are canonical JSON, stored under ``manifests/<number>.json``; each one is a cut
a restore can start from.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agent_blackbox.backup._errors import BackupCorrupt
from agent_blackbox.schemas import CheckpointSigner, CheckpointVerifier, canonical_json

MANIFEST_PURPOSE = "agent-blackbox backup manifest v1"
"""Bound into every signed manifest, so its signature means "this is a backup manifest"."""

GENESIS_MANIFEST = "0" * 64
"""What the first manifest of a store names as the one before it."""

MANIFESTS = "manifests/"


def manifest_key(number: int) -> str:
    """The key of manifest ``number`` (zero-padded, so keys sort in number order)."""
    return f"{MANIFESTS}{number:012d}.json"


@dataclass(frozen=True, slots=True)
class RunRange:
    """What a segment holds of one run."""

    run_id: str
    first_sequence: int
    last_sequence: int
    count: int


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """One event segment: where it is, its digest, and what is in it."""

    key: str
    sha256: str
    size: int
    partition: int
    first_offset: int
    last_offset: int
    count: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    event_digest: str
    """Rolling SHA-256 over the event ids of the segment's envelopes, in offset order."""
    undecodable: int
    """Messages kept whole whose envelope did not decode (no run, no event id)."""
    runs: tuple[RunRange, ...]


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One table of a database snapshot, as an object."""

    key: str
    sha256: str
    rows: int


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """The database snapshot taken in one repeatable-read transaction after the segments
    of its manifest were written."""

    taken_at: str
    tables: Mapping[str, TableEntry]
    kek_versions: tuple[str, ...]
    """The key-encryption key versions the key rows were wrapped under (never a KEK)."""
    blobs: int


@dataclass(frozen=True, slots=True)
class LostRange:
    """Offsets the topic's retention removed before the backup read them."""

    partition: int
    first_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """One backup step, signed."""

    number: int
    previous: str
    topic: str
    created_at: str
    segments: tuple[SegmentEntry, ...]
    positions: Mapping[int, int]
    """Partition → the next offset to back up (everything before it is in this or an
    earlier manifest, or in ``lost``)."""
    snapshot: SnapshotEntry
    lost: tuple[LostRange, ...] = ()
    signer_key_id: str = ""
    signature: bytes = field(default=b"", repr=False)

    def statement(self) -> dict[str, Any]:
        """What the signature covers: everything but the signature itself."""
        return {
            "purpose": MANIFEST_PURPOSE,
            "number": self.number,
            "previous": self.previous,
            "topic": self.topic,
            "created_at": self.created_at,
            "segments": [_segment_doc(s) for s in self.segments],
            "positions": {str(p): o for p, o in sorted(self.positions.items())},
            "snapshot": _snapshot_doc(self.snapshot),
            "lost": [[r.partition, r.first_offset, r.end_offset] for r in self.lost],
            "signer_key_id": self.signer_key_id,
        }

    def to_bytes(self) -> bytes:
        """The stored form: canonical JSON of the statement and the signature."""
        signature = base64.b64encode(self.signature).decode()
        return canonical_json({**self.statement(), "signature": signature})

    @property
    def digest(self) -> str:
        """SHA-256 of the stored form: what the next manifest names as ``previous``."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def key(self) -> str:
        return manifest_key(self.number)

    def signed(self, signer: CheckpointSigner) -> Manifest:
        """This manifest signed by ``signer``."""
        draft = replace(self, signer_key_id=signer.key_id, signature=b"")
        return replace(draft, signature=signer.sign_statement(draft.statement()))

    def signature_problem(self, verifier: CheckpointVerifier) -> str | None:
        """Why the signature does not prove this manifest; None when it does."""
        return verifier.statement_problem(
            self.statement(), signer_key_id=self.signer_key_id, signature=self.signature
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, key: str) -> Manifest:
        """Parse a stored manifest.

        Raises:
            BackupCorrupt: naming ``key`` and what is wrong (truncated, not JSON, a field
                missing or of the wrong type, another purpose).
        """
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise BackupCorrupt(
                f"manifest {key} is not valid JSON ({exc}): truncated or overwritten"
            ) from exc
        read = _Reader(key)
        doc = read.mapping(doc, "manifest")
        if doc.get("purpose") != MANIFEST_PURPOSE:
            raise BackupCorrupt(f"manifest {key} is not a backup manifest of this format")
        manifest = cls._parsed(read, doc)
        # Only the canonical form is a manifest: anything else was edited after it was
        # written, even where each value reads the same.
        if manifest.to_bytes() != bytes(data):
            raise BackupCorrupt(
                f"manifest {key} is not in the canonical form it was written in: it was "
                "edited after it was written"
            )
        return manifest

    @classmethod
    def _parsed(cls, read: _Reader, doc: dict[str, Any]) -> Manifest:
        return cls(
            number=read.field(doc, "number", int),
            previous=read.hex64(doc, "previous"),
            topic=read.field(doc, "topic", str),
            created_at=read.field(doc, "created_at", str),
            segments=tuple(read.segment(s) for s in read.field(doc, "segments", list)),
            positions=read.positions(read.field(doc, "positions", dict)),
            snapshot=read.snapshot(read.field(doc, "snapshot", dict)),
            lost=tuple(read.lost(r) for r in read.field(doc, "lost", list)),
            signer_key_id=read.field(doc, "signer_key_id", str),
            signature=read.signature(read.field(doc, "signature", str)),
        )


def _segment_doc(s: SegmentEntry) -> dict[str, Any]:
    return {
        "key": s.key,
        "sha256": s.sha256,
        "size": s.size,
        "partition": s.partition,
        "first_offset": s.first_offset,
        "last_offset": s.last_offset,
        "count": s.count,
        "first_timestamp_ms": s.first_timestamp_ms,
        "last_timestamp_ms": s.last_timestamp_ms,
        "event_digest": s.event_digest,
        "undecodable": s.undecodable,
        "runs": [[r.run_id, r.first_sequence, r.last_sequence, r.count] for r in s.runs],
    }


def _snapshot_doc(s: SnapshotEntry) -> dict[str, Any]:
    return {
        "taken_at": s.taken_at,
        "tables": {
            name: {"key": t.key, "sha256": t.sha256, "rows": t.rows}
            for name, t in sorted(s.tables.items())
        },
        "kek_versions": list(s.kek_versions),
        "blobs": s.blobs,
    }


_T = TypeVar("_T")


class _Reader:
    """Typed reads of a parsed manifest, each failure naming the manifest and field."""

    def __init__(self, key: str) -> None:
        self._key = key

    def fail(self, what: str) -> BackupCorrupt:
        return BackupCorrupt(f"manifest {self._key}: {what}")

    def mapping(self, value: object, what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"{what} is not an object")
        return value

    def field(self, doc: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
        value = doc.get(name)
        # bool is an int to Python, never to a manifest.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"field {name!r} is missing or not a {kind.__name__}")
        return value

    def hex64(self, doc: Mapping[str, Any], name: str) -> str:
        value = self.field(doc, name, str)
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise self.fail(f"field {name!r} is not a SHA-256 in hex")
        return value

    def rows(self, value: object, what: str, build: Callable[[list[Any]], _T]) -> _T:
        if not isinstance(value, list):
            raise self.fail(f"{what} is not a list")
        try:
            return build(value)
        except (TypeError, ValueError, IndexError) as exc:
            raise self.fail(f"{what} is malformed: {exc}") from exc

    def segment(self, raw: object) -> SegmentEntry:
        doc = self.mapping(raw, "a segment entry")
        ints = {
            name: self.field(doc, name, int)
            for name in (
                "size",
                "partition",
                "first_offset",
                "last_offset",
                "count",
                "first_timestamp_ms",
                "last_timestamp_ms",
                "undecodable",
            )
        }
        runs = tuple(self.rows(r, "a run range", _run_range) for r in self.field(doc, "runs", list))
        return SegmentEntry(
            key=self.field(doc, "key", str),
            sha256=self.hex64(doc, "sha256"),
            event_digest=self.hex64(doc, "event_digest"),
            runs=runs,
            **ints,
        )

    def positions(self, doc: Mapping[str, Any]) -> dict[int, int]:
        try:
            return {int(p): _plain_int(o) for p, o in doc.items()}
        except (TypeError, ValueError) as exc:
            raise self.fail(f"positions are malformed: {exc}") from exc

    def snapshot(self, doc: Mapping[str, Any]) -> SnapshotEntry:
        tables = {}
        for name, raw in self.field(doc, "tables", dict).items():
            table = self.mapping(raw, f"snapshot table {name!r}")
            tables[str(name)] = TableEntry(
                key=self.field(table, "key", str),
                sha256=self.hex64(table, "sha256"),
                rows=self.field(table, "rows", int),
            )
        versions = self.field(doc, "kek_versions", list)
        if not all(isinstance(v, str) for v in versions):
            raise self.fail("kek_versions holds something other than names")
        return SnapshotEntry(
            taken_at=self.field(doc, "taken_at", str),
            tables=tables,
            kek_versions=tuple(versions),
            blobs=self.field(doc, "blobs", int),
        )

    def lost(self, raw: object) -> LostRange:
        return self.rows(raw, "a lost range", _lost_range)

    def signature(self, value: str) -> bytes:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise self.fail("the signature is not base64") from exc


def _run_range(value: list[Any]) -> RunRange:
    if len(value) != 4 or not isinstance(value[0], str):
        raise ValueError("a run range is [run id, first sequence, last sequence, count]")
    return RunRange(value[0], *(_plain_int(x) for x in value[1:]))


def _lost_range(value: list[Any]) -> LostRange:
    if len(value) != 3:
        raise ValueError("a lost range is [partition, first offset, end offset]")
    return LostRange(*(_plain_int(x) for x in value))


def _plain_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value
