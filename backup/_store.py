"""The backup-store port: where backups live, named by keys, whatever the technology.

A backup is a set of immutable objects (event files, snapshots, manifests) under
``/``-separated keys. The port asks for the five things a backup and a restore do:
put, get, list in key order, delete, and say where it is (for messages).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from agent_blackbox.schemas import BlackboxError

BACKUP_URL_ENV = "BLACKBOX_BACKUP_URL"


class StoreError(BlackboxError):
    """The backup store could not do what was asked (unreachable, credentials refused,
    no such bucket or folder, a bad key); the message says which and what to do."""


class StoreUnreachable(StoreError):
    """The store did not answer, or answered that it cannot serve now (a connection
    refused or timed out, a 5xx such as 503 Slow Down): worth trying again later."""


class ObjectMissing(StoreError):
    """No object under that key."""

    def __init__(self, key: str, where: str) -> None:
        super().__init__(f"no object {key!r} in {where}")
        self.key = key


@runtime_checkable
class BackupStore(Protocol):
    """Where backup objects are kept (:class:`~agent_blackbox.backup.FolderStore`,
    :class:`~agent_blackbox.backup.S3Store`).

    Keys are relative, ``/``-separated, of letters, digits and ``._=-`` (checked by
    :func:`check_key`); objects are written whole and never changed in place.
    """

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, whole or not at all (a reader never sees part of
        it); an object already there is replaced."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes under ``key``.

        Raises:
            ObjectMissing: nothing is stored under ``key``.
        """
        ...

    def keys(self, prefix: str = "") -> Iterator[str]:
        """The keys that start with ``prefix``, in ascending order."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object under ``key``; nothing to do when there is none."""
        ...

    def describe(self) -> str:
        """Where the store is, for messages (no secret)."""
        ...


_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")
MAX_KEY_LENGTH = 512


def check_key(key: str, *, prefix: bool = False) -> str:
    """``key`` when it is a valid object key (a prefix may end with ``/`` or be empty).

    A key is 1 to :data:`MAX_KEY_LENGTH` characters of ``/``-separated segments, each
    starting with a letter or digit and made of letters, digits and ``._=-``: no empty
    segment, no ``..``, no absolute path, so no key names anything outside the store.

    Raises:
        StoreError: naming what is wrong with the key.
    """
    if not isinstance(key, str):
        raise StoreError(f"an object key is a string, not {type(key).__name__}")
    if len(key) > MAX_KEY_LENGTH:
        raise StoreError(f"object key of {len(key)} characters: at most {MAX_KEY_LENGTH}")
    body = key[:-1] if prefix and key.endswith("/") else key
    if prefix and not body:
        return key
    for segment in body.split("/"):
        if _SEGMENT.fullmatch(segment) is None:
            raise StoreError(
                f"invalid object key {key!r}: each '/'-separated part must start with a "
                "letter or digit and hold only letters, digits and ._=-"
            )
    return key
