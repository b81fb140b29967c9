"""A backup store whose newest manifests were removed is not restored from as if its
older cut were the newest.

Attack: someone with write access to the store deletes the newest manifest (the cut
taken after a deletion, say), so that the chain left verifies on its own and ends at an
older cut. ``backup verify`` notices, from the production database's record of how far
the backup got; ``restore`` and ``drill`` run the same check, with or without ``--at``,
and refuse (exit 1, naming the manifest and why) unless the operator names the cut to
trust with ``--trust-cut``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from agent_blackbox.backup import BackupStore, open_store
from agent_blackbox.schemas import Settings
from tests.integration._backups import cut, record, relay
from tests.integration._wait import eventually
from tests.security._restores import Copies, copies  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture
def truncated(settings: Settings, engine: Engine, s3_url: str) -> dict[str, str]:
    """Two cuts, the newest one's manifest deleted from the store: the run ids, and the
    kept cut's key."""
    store: BackupStore = open_store(s3_url)
    ada = record(engine, settings, "ada")
    relay(engine, settings)
    first = cut(settings, engine, store)
    grace = record(engine, settings, "grace")
    relay(engine, settings)
    newest = cut(settings, engine, store)
    store.delete(newest.key)
    return {"ada": ada, "grace": grace, "kept": first.key}


def _databases(engine: Engine, prefix: str) -> list[str]:
    with engine.connect() as conn:
        names = conn.execute(
            text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": f"{prefix}%"}
        )
        return [str(n) for n in names.scalars()]


def test_verify_restore_and_drill_all_refuse_it(
    copies: Copies,  # noqa: F811
    engine: Engine,
    truncated: dict[str, str],
    tmp_path: object,
) -> None:
    verified = copies.cli("backup", "verify")
    assert verified.exit_code == 1, verified.output

    name = copies.restore_name(f"t{uuid.uuid4().hex[:10]}")
    # --at picks the cut; it does not excuse a store that lost its end.
    # The text keeps whole seconds and the cut may be of this very second: the time
    # given is the next whole second, once it has come (a time to come is refused).
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    eventually(lambda: datetime.now(UTC) >= at, timeout=5, what="the next whole second")
    now = at.strftime("%Y-%m-%dT%H:%M:%S%z")
    for extra in ([], ["--at", now]):
        restored = copies.cli(
            "restore",
            "--into",
            name,
            "--runs",
            truncated["ada"],
            "--purpose",
            "complaint 7",
            "--env-file",
            f"{tmp_path}/{name}.env",
            *extra,
        )
        assert restored.exit_code == 1, (extra, restored.output)
        said = " ".join(restored.output.split())
        assert truncated["kept"] in said
        assert "manifests after it were removed" in said
        assert "--trust-cut" in said
    assert _databases(engine, f"blackbox_restore_{name}") == []  # nothing was made

    drilled = copies.cli("drill", "--sample", "0", "--json")
    assert drilled.exit_code == 1, drilled.output
    assert "manifests after it were removed" in drilled.output
    assert '"target": null' in drilled.output  # refused before any copy was made


def test_naming_the_cut_to_trust_restores_it_and_still_says_what_was_removed(
    copies: Copies,  # noqa: F811
    truncated: dict[str, str],
    tmp_path: object,
) -> None:
    name = copies.restore_name(f"t{uuid.uuid4().hex[:10]}")
    restored = copies.cli(
        "restore",
        "--into",
        name,
        "--runs",
        f"{truncated['ada']},{truncated['grace']}",
        "--purpose",
        "complaint 7",
        "--env-file",
        f"{tmp_path}/{name}.env",
        "--trust-cut",
        truncated["kept"],
    )

    assert restored.exit_code == 0, restored.output
    said = " ".join(restored.output.split())
    assert "restored 1 runs" in said  # grace's run is only in the removed cut
    assert "as told although" in said
    assert "manifests after it were removed" in said
    assert f"not in the backup: {truncated['grace']}" in said


def test_a_cut_to_trust_must_be_one_the_store_holds(
    copies: Copies,  # noqa: F811
    truncated: dict[str, str],
    tmp_path: object,
) -> None:
    name = copies.restore_name(f"t{uuid.uuid4().hex[:10]}")
    common = ["restore", "--into", name, "--runs", truncated["ada"], "--purpose", "complaint 7"]
    common += ["--env-file", f"{tmp_path}/{name}.env"]

    missing = copies.cli(*common, "--trust-cut", "2")
    assert missing.exit_code == 2, missing.output
    assert "holds no manifest manifests/000000000002.json" in " ".join(missing.output.split())

    malformed = copies.cli(*common, "--trust-cut", "../1")
    assert malformed.exit_code == 2, malformed.output
    assert "is not a backup cut" in malformed.output
