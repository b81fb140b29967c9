"""The one check a backup passes before anything trusts it: ``backup verify``, the
drill and ``restore`` all run :func:`check_backup`.

A store is checked where it is (:func:`~agent_blackbox.backup._verify.check_store`: the
signed manifest chain and every object it names), and against the production database's
record of how far the backup got: a store whose newest manifests were removed holds a
chain that verifies, but ends early, and restoring it would bring back an older cut as
if it were the newest. That check is made whatever cut is restored (``--at`` picks an
older cut; it does not excuse a store that lost its end). Only an operator who names the
cut to trust (``--trust-cut N``) restores from such a store, and the removal is still
reported.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.backup._chain import head_manifest, manifest_numbers
from agent_blackbox.backup._errors import BackupCorrupt, BackupError, first_line
from agent_blackbox.backup._manifest import MANIFESTS, manifest_key
from agent_blackbox.backup._store import BackupStore
from agent_blackbox.backup._verify import StoreCheck, check_store
from agent_blackbox.backup._writer import recorded_offsets
from agent_blackbox.schemas import CheckpointVerifier, Settings

Progress = Callable[[int, int], None]

TRUST_CUT_OPTION = "--trust-cut"
"""The option of ``restore`` and ``drill`` that names the cut an operator vouches for."""


def check_backup(
    production: Settings,
    store: BackupStore,
    verifier: CheckpointVerifier,
    *,
    at: datetime | None = None,
    trust_cut: int | None = None,
    progress: Progress | None = None,
) -> StoreCheck:
    """Check ``store`` up to its cut: the newest, the last at or before ``at``, or the
    manifest numbered ``trust_cut``; every problem is in the result's ``problems``.

    With ``trust_cut``, manifests removed after the store's newest one are reported in
    ``waived`` instead of failing the check: the operator named the cut to trust.

    Raises:
        BackupError: nothing to check (no manifest, none at or before ``at``), or
            ``trust_cut`` names a manifest the store does not hold, or both ``at`` and
            ``trust_cut`` were given.
    """
    if at is not None and trust_cut is not None:
        raise BackupError(f"give --at or {TRUST_CUT_OPTION}, not both: each chooses the cut")
    if trust_cut is not None:
        _require_manifest(store, trust_cut)
    try:
        recorded = recorded_by_production(production, store)
        unchecked = None
    except SQLAlchemyError as exc:
        recorded, unchecked = None, first_line(exc)
    check = check_store(
        store,
        verifier,
        at=at,
        upto=trust_cut,
        progress=progress,
        recorded=recorded,
        trusted=trust_cut is not None,
    )
    if check.cut is None and not check.chain.problems:
        raise BackupError(no_cut(store, at))
    if unchecked is not None:
        check.unchecked.append(
            "not checked: whether the store's newest manifests were removed (production's "
            f"database, which records how far the backup got, cannot be read: {unchecked})"
        )
    return check


def parse_cut(value: str) -> int:
    """The manifest number ``value`` names: ``7`` or ``manifests/000000000007.json``.

    Raises:
        ValueError: it names no manifest.
    """
    text = value.strip()
    if text.startswith(MANIFESTS) and text.endswith(".json"):
        text = text[len(MANIFESTS) : -len(".json")]
    if not text.isdecimal() or int(text) < 1:
        raise ValueError(
            f"{value!r} is not a backup cut: give its manifest number (7) or key "
            f"({manifest_key(7)}), as `blackbox backup verify` prints it"
        )
    return int(text)


def _require_manifest(store: BackupStore, number: int) -> None:
    numbers = manifest_numbers(store)
    if number not in numbers:
        newest = f"its newest is {manifest_key(numbers[-1])}" if numbers else "it holds none"
        raise BackupError(
            f"{TRUST_CUT_OPTION} {number}: {store.describe()} holds no manifest "
            f"{manifest_key(number)} ({newest})"
        )


def recorded_by_production(production: Settings, store: BackupStore) -> dict[int, int] | None:
    """How far production's database says the backup got (None: unknown).

    Raises:
        SQLAlchemyError: production's database cannot be read.
    """
    try:
        head = head_manifest(store)
    except BackupCorrupt:
        return None  # the check names the unreadable manifest
    return None if head is None else recorded_offsets(production, store, head.positions)


def no_cut(store: BackupStore, at: datetime | None) -> str:
    """Why there is nothing to restore or check, and what to do."""
    if at is not None:
        return (
            f"no backup cut in {store.describe()} was written at or before {at.isoformat()}; "
            "give a later --at"
        )
    return (
        f"no backup in {store.describe()}: run `blackbox backup run`, or point --store "
        "(BLACKBOX_BACKUP_URL) at the store backed up to"
    )
