"""Prune records: what ``blackbox backup prune`` removed from a store, signed.

A check reads them to tell an object removed on purpose from one that went missing.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field, replace
from typing import Any

from agent_blackbox.backup._chain import ChainProblem
from agent_blackbox.backup._errors import BackupCorrupt
from agent_blackbox.backup._store import BackupStore, ObjectMissing
from agent_blackbox.schemas import CheckpointSigner, CheckpointVerifier, canonical_json

PRUNE_PURPOSE = "agent-blackbox backup prune v1"
PRUNED = "pruned/"


@dataclass(frozen=True, slots=True)
class PruneRecord:
    """What one prune removed, signed."""

    number: int
    created_at: str
    segments: tuple[str, ...]
    cuts: tuple[int, ...]
    """Manifests whose snapshots were removed (they can no longer be restored)."""
    signer_key_id: str = ""
    signature: bytes = field(default=b"", repr=False)

    @property
    def key(self) -> str:
        return f"{PRUNED}{self.number:012d}.json"

    def statement(self) -> dict[str, Any]:
        return {
            "purpose": PRUNE_PURPOSE,
            "number": self.number,
            "created_at": self.created_at,
            "segments": list(self.segments),
            "cuts": list(self.cuts),
            "signer_key_id": self.signer_key_id,
        }

    def to_bytes(self) -> bytes:
        signature = base64.b64encode(self.signature).decode()
        return canonical_json({**self.statement(), "signature": signature})

    def signed(self, signer: CheckpointSigner) -> PruneRecord:
        draft = replace(self, signer_key_id=signer.key_id, signature=b"")
        return replace(draft, signature=signer.sign_statement(draft.statement()))

    @classmethod
    def from_bytes(cls, data: bytes, *, key: str) -> PruneRecord:
        """Parse a stored record.

        Raises:
            BackupCorrupt: naming ``key``: not a prune record in its canonical form.
        """
        try:
            doc = json.loads(data)
            record = cls(
                number=_int(doc["number"]),
                created_at=str(doc["created_at"]),
                segments=tuple(_text(s) for s in doc["segments"]),
                cuts=tuple(_int(c) for c in doc["cuts"]),
                signer_key_id=_text(doc["signer_key_id"]),
                signature=base64.b64decode(_text(doc["signature"]), validate=True),
            )
            purpose = doc["purpose"]
        except (ValueError, TypeError, KeyError, RecursionError, binascii.Error) as exc:
            raise BackupCorrupt(f"prune record {key} is malformed: {exc}") from exc
        if purpose != PRUNE_PURPOSE or record.to_bytes() != bytes(data):
            raise BackupCorrupt(f"prune record {key} is not in the form it was written in")
        return record


@dataclass(slots=True)
class Pruned:
    """Everything the prune records of a store say was removed, and their problems."""

    segments: set[str] = field(default_factory=set)
    cuts: set[int] = field(default_factory=set)
    records: int = 0
    problems: list[ChainProblem] = field(default_factory=list)


def load_pruned(store: BackupStore, verifier: CheckpointVerifier) -> Pruned:
    """The genuine prune records of ``store``; any other is a problem (and ignored)."""
    pruned = Pruned()
    for key in store.keys(PRUNED):
        try:
            record = PruneRecord.from_bytes(store.get(key), key=key)
        except (BackupCorrupt, ObjectMissing) as exc:
            pruned.problems.append(ChainProblem(key, str(exc)))
            continue
        problem = verifier.statement_problem(
            record.statement(), signer_key_id=record.signer_key_id, signature=record.signature
        )
        if problem is not None:
            pruned.problems.append(ChainProblem(key, f"signature: {problem}"))
            continue
        pruned.segments.update(record.segments)
        pruned.cuts.update(record.cuts)
        pruned.records += 1
    return pruned


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value
