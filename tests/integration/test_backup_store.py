"""The backup-store contract, run against every adapter: a folder, and S3-compatible
object storage (S3Proxy, MinIO or the store ``BLACKBOX_BACKUP_URL`` names)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_blackbox.backup import (
    BackupStore,
    FolderStore,
    ObjectMissing,
    S3Store,
    StoreError,
    open_store,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BackupStore:
    if request.param == "folder":
        return open_store(f"file://{tmp_path}/backups")
    return open_store(request.getfixturevalue("s3_url"))


def test_an_object_comes_back_as_it_was_put(store: BackupStore) -> None:
    payloads = {
        "empty": b"",
        "binary/all-bytes": bytes(range(256)) * 4,
        "large/five-mebibytes": os.urandom(5 * 1024 * 1024),
    }
    for key, data in payloads.items():
        store.put(key, data)
    for key, data in payloads.items():
        assert store.get(key) == data


def test_put_replaces_and_delete_removes(store: BackupStore) -> None:
    store.put("manifests/head", b"one")
    store.put("manifests/head", b"two")
    assert store.get("manifests/head") == b"two"
    store.delete("manifests/head")
    with pytest.raises(ObjectMissing, match="manifests/head"):
        store.get("manifests/head")
    store.delete("manifests/head")  # nothing there: nothing to do


def test_keys_are_listed_in_order_under_a_prefix(store: BackupStore) -> None:
    assert list(store.keys()) == []
    for key in ("p2/b", "p1/c/d", "p1/a", "p10/z", "top"):
        store.put(key, key.encode())
    assert list(store.keys()) == ["p1/a", "p1/c/d", "p10/z", "p2/b", "top"]
    assert list(store.keys("p1/")) == ["p1/a", "p1/c/d"]
    assert list(store.keys("p1")) == ["p1/a", "p1/c/d", "p10/z"]
    assert list(store.keys("nothing/")) == []


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/etc/passwd",
        "../outside",
        "a/../../b",
        "a//b",
        ".hidden",
        "a/.partial-x",
        "a\\b",
        "spaces are not keys",
        "ü",
        "x" * 600,
    ],
)
def test_a_hostile_key_is_refused_and_writes_nothing(store: BackupStore, key: str) -> None:
    with pytest.raises(StoreError, match="key"):
        store.put(key, b"payload")
    with pytest.raises(StoreError, match="key"):
        store.get(key)
    assert list(store.keys()) == []


def test_a_folder_store_never_lists_a_write_in_progress(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    store.put("done", b"whole")
    (tmp_path / ".partial-1234").write_bytes(b"half")
    assert list(store.keys()) == ["done"]


def test_s3_refuses_wrong_credentials_clearly(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = open_store(s3_url)
    assert isinstance(store, S3Store)
    for attempt in (lambda: store.put("k", b"v"), lambda: list(store.keys())):
        with pytest.raises(StoreError, match=r"refused the credentials.*AWS_SECRET_ACCESS_KEY"):
            attempt()


def test_s3_names_a_missing_bucket_and_an_unreachable_endpoint(s3_url: str) -> None:
    endpoint = s3_url.split("endpoint=", 1)[1]
    no_bucket = open_store(f"s3://no-such-bucket-here/x?endpoint={endpoint}")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
        no_bucket.put("k", b"v")
    closed = open_store("s3://blackbox-backups/x?endpoint=http://127.0.0.1:9")
    with pytest.raises(StoreError, match="could not reach"):
        closed.get("k")
