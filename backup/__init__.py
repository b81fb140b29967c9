"""Backups of the event log to object storage.

The port, :class:`BackupStore`, names where backup objects live; two adapters implement
it: :class:`FolderStore` (a local folder) and :class:`S3Store` (AWS S3 or any
S3-compatible store: MinIO, S3Proxy, ...). :func:`open_store` builds one from
``BLACKBOX_BACKUP_URL``::

    from agent_blackbox.backup import open_store

    store = open_store("s3://blackbox-backups/prod?endpoint=http://127.0.0.1:29900")
    store.put("hello/world", b"...")
"""

from __future__ import annotations

from agent_blackbox.backup._folder import FolderStore
from agent_blackbox.backup._open import open_store
from agent_blackbox.backup._s3 import S3Store
from agent_blackbox.backup._store import (
    BACKUP_URL_ENV,
    MAX_KEY_LENGTH,
    BackupStore,
    ObjectMissing,
    StoreError,
    check_key,
)

__all__ = [
    "BACKUP_URL_ENV",
    "MAX_KEY_LENGTH",
    "BackupStore",
    "FolderStore",
    "ObjectMissing",
    "S3Store",
    "StoreError",
    "check_key",
    "open_store",
]
