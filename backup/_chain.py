"""Reading a store's manifest chain: the newest manifest, a cut, the whole series checked."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from agent_blackbox.backup._errors import BackupCorrupt
from agent_blackbox.backup._manifest import GENESIS_MANIFEST, MANIFESTS, Manifest, manifest_key
from agent_blackbox.backup._store import BackupStore, ObjectMissing
from agent_blackbox.schemas import CheckpointVerifier


def manifest_numbers(store: BackupStore) -> list[int]:
    """The numbers of the manifests in ``store``, ascending (other keys are ignored)."""
    numbers = []
    for key in store.keys(MANIFESTS):
        name = key[len(MANIFESTS) :]
        if name.endswith(".json") and name[:-5].isdigit():
            numbers.append(int(name[:-5]))
    return sorted(numbers)


def read_manifest(store: BackupStore, number: int) -> Manifest:
    """Manifest ``number``, parsed.

    Raises:
        BackupCorrupt: it is missing or malformed.
    """
    key = manifest_key(number)
    try:
        data = store.get(key)
    except ObjectMissing as exc:
        raise BackupCorrupt(f"manifest {key} is missing from {store.describe()}") from exc
    manifest = Manifest.from_bytes(data, key=key)
    if manifest.number != number:
        raise BackupCorrupt(f"manifest {key} says it is number {manifest.number}")
    return manifest


def head_manifest(store: BackupStore) -> Manifest | None:
    """The newest manifest in ``store``; None for a store no backup wrote to yet."""
    numbers = manifest_numbers(store)
    return read_manifest(store, numbers[-1]) if numbers else None


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """Something wrong with the manifest chain, naming the manifest (or object) concerned."""

    where: str
    problem: str


@dataclass(slots=True)
class Chain:
    """The manifests of a store up to a cut, in order, with what was found wrong."""

    manifests: list[Manifest] = field(default_factory=list)
    problems: list[ChainProblem] = field(default_factory=list)

    @property
    def cut(self) -> Manifest | None:
        return self.manifests[-1] if self.manifests else None


def load_chain(
    store: BackupStore,
    verifier: CheckpointVerifier,
    *,
    at: datetime | None = None,
    upto: int | None = None,
) -> Chain:
    """Every manifest from the first up to the newest (or the last created at or before
    ``at``, or the one numbered ``upto``), each checked: readable, numbered in order,
    naming its predecessor's SHA-256, and signed by a known key. A manifest that fails is
    recorded as a problem and the chain stops before it only if it cannot be read at all.
    """
    chain = Chain()
    previous = GENESIS_MANIFEST
    expected = 1
    for number in manifest_numbers(store):
        if upto is not None and number > upto:
            break
        key = manifest_key(number)
        if number != expected:
            chain.problems.append(
                ChainProblem(key, f"manifest {manifest_key(expected)} is missing before it")
            )
        try:
            data = store.get(key)
            manifest = Manifest.from_bytes(data, key=key)
        except (BackupCorrupt, ObjectMissing) as exc:
            chain.problems.append(ChainProblem(key, str(exc)))
            break
        if manifest.number != number:
            chain.problems.append(ChainProblem(key, f"it says it is number {manifest.number}"))
        if manifest.previous != previous:
            chain.problems.append(
                ChainProblem(
                    key,
                    "it does not name the SHA-256 of the manifest before it: the chain was "
                    "broken (a manifest replaced, removed or inserted)",
                )
            )
        problem = manifest.signature_problem(verifier)
        if problem is not None:
            chain.problems.append(ChainProblem(key, f"signature: {problem}"))
        # Only a genuine manifest's time is believed: the check above comes first.
        if at is not None:
            created = _created(manifest)
            if created is None:
                chain.problems.append(ChainProblem(key, "its created_at is not a UTC time"))
                break
            if created > at:
                break
        chain.manifests.append(manifest)
        previous = hashlib.sha256(data).hexdigest()
        expected = number + 1
    return chain


def _created(manifest: Manifest) -> datetime | None:
    try:
        created = datetime.fromisoformat(manifest.created_at)
    except ValueError:
        return None
    return created if created.tzinfo is not None else None
