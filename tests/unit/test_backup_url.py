"""``open_store``: which store a backup URL names, and the clear refusals of the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_blackbox.backup import FolderStore, S3Store, StoreError, check_key, open_store


def test_a_file_url_is_a_folder_store() -> None:
    store = open_store("file:///var/backups/blackbox")
    assert isinstance(store, FolderStore)
    assert store.root == Path("/var/backups/blackbox")


def test_an_s3_url_is_an_s3_store_with_its_endpoint_and_prefix() -> None:
    store = open_store("s3://bucket/team/prod?endpoint=http://127.0.0.1:29900&region=eu-west-1")
    assert isinstance(store, S3Store)
    assert store.describe() == "s3://bucket/team/prod/ at http://127.0.0.1:29900"


def test_the_url_comes_from_the_environment_when_not_given() -> None:
    store = open_store(environ={"BLACKBOX_BACKUP_URL": "file:///tmp/b"})
    assert isinstance(store, FolderStore)
    with pytest.raises(StoreError, match="set BLACKBOX_BACKUP_URL"):
        open_store(environ={})


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://host/x", "names no store"),
        ("/var/backups", "names no store"),
        ("file://relative/folder", "file:///absolute/path"),
        ("file:///tmp/x?sync=1", "no options"),
        ("s3:///prefix", "names no bucket"),
        ("s3://bucket/p?endpoint=http://h:1&secret=abc", "unknown option secret"),
        ("s3://bucket/p?endpoint=ftp://h", "http:// or https://"),
        ("s3://bucket/../../etc", "invalid object key"),
    ],
)
def test_a_wrong_url_is_refused_naming_what_to_write(url: str, says: str) -> None:
    with pytest.raises(StoreError, match=says):
        open_store(url)


def test_a_url_with_credentials_in_it_is_not_echoed() -> None:
    with pytest.raises(StoreError) as refused:
        open_store("ftp://user:hunter2@host/x")
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("key", ["a", "runs/2026/12/part-0007.avro", "m=1/x_y-z.json"])
def test_keys_of_letters_digits_and_separators_pass(key: str) -> None:
    assert check_key(key) == key
