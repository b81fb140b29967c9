"""Names that left ``agent_blackbox.outbox``'s surface keep working for one release: each
still imports, gives the same object, and warns with a ``DeprecationWarning`` that names
where it is now."""

from __future__ import annotations

import re
import warnings

import pytest

import agent_blackbox.outbox as write_side
from agent_blackbox.outbox import storage
from agent_blackbox.testing import AsyncMemoryRecorder, MemoryRecorder

# Names the storage module gained after the move were never at the old path.
ADDED_SINCE = {
    "UNATTRIBUTED",
    "attribute_blobs_txn",
    "remember_tenancy_heads_txn",
    "tenancy_heads_txn",
    "unattributed_blobs_txn",
    "unclaimed_blobs_txn",
}
STORAGE_NAMES = sorted(set(storage.__all__) - ADDED_SINCE)


def test_the_storage_module_holds_the_tables_txn_functions_and_migrations() -> None:
    assert {"outbox", "runs", "blobs", "effects", "data_keys"} <= set(STORAGE_NAMES)
    assert {name for name in storage.__all__ if name.endswith("_txn")} == {
        "attribute_blobs_txn",
        "remember_tenancy_heads_txn",
        "tenancy_heads_txn",
        "unattributed_blobs_txn",
        "unclaimed_blobs_txn",
        "grant_tenant_txn",
        "outbox_backlog_txn",
        "pending_events_txn",
        "revoke_tenant_txn",
        "run_heads_txn",
        "tenant_grants_txn",
    }
    assert "migrate_write_side" in STORAGE_NAMES


def test_the_write_sides_surface_no_longer_lists_them() -> None:
    listed = set(write_side.__all__) | set(dir(write_side))
    assert not listed & {*storage.__all__, "SyncRecorder", "AsyncRecorderBase"}
    assert not [name for name in listed if name.endswith("_txn")]


@pytest.mark.parametrize("name", STORAGE_NAMES)
def test_a_storage_name_at_its_old_path_warns_and_works(name: str) -> None:
    with pytest.warns(DeprecationWarning, match="agent_blackbox.outbox.storage") as caught:
        found = getattr(write_side, name)
    assert found is getattr(storage, name)
    [warning] = caught.list
    assert str(warning.message) == (
        f"agent_blackbox.outbox.{name} is deprecated and goes in the next release: "
        "import it from agent_blackbox.outbox.storage"
    )
    assert warning.filename == __file__  # the warning points at the caller's line


def test_the_from_import_form_warns_at_the_importing_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace: dict[str, object] = {}
        code = "from agent_blackbox.outbox import outbox, run_heads_txn"
        exec(compile(code, "agent.py", "exec"), namespace)
    assert namespace["outbox"] is storage.outbox
    assert namespace["run_heads_txn"] is storage.run_heads_txn
    # The import system looks a name up twice (is it a submodule? then the name itself):
    # both warnings point at the importing line, so the default filter shows it once.
    assert {(w.category, w.filename, w.lineno) for w in caught} == {
        (DeprecationWarning, "agent.py", 1)
    }
    named = {str(w.message).split(" is deprecated")[0] for w in caught}
    assert named == {"agent_blackbox.outbox.outbox", "agent_blackbox.outbox.run_heads_txn"}


@pytest.mark.parametrize(
    ("old", "memory", "instead"),
    [
        ("SyncRecorder", MemoryRecorder, "`Recorder | MemoryRecorder`"),
        ("AsyncRecorderBase", AsyncMemoryRecorder, "`AsyncRecorder | AsyncMemoryRecorder`"),
    ],
)
def test_the_recorders_old_base_names_warn_and_still_match_both_recorders(
    old: str, memory: type, instead: str
) -> None:
    with pytest.warns(DeprecationWarning, match=f"agent_blackbox.outbox.{old} is deprecated"):
        base = getattr(write_side, old)
    assert issubclass(memory, base)
    postgres = write_side.Recorder if old == "SyncRecorder" else write_side.AsyncRecorder
    assert issubclass(postgres, base)
    with pytest.warns(DeprecationWarning, match=re.escape(instead)):
        getattr(write_side, old)
