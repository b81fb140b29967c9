"""Key files on disk: written so nothing planted can redirect or widen the write, read
only when nobody but the owner can read them.

Writing goes to a fresh temporary file in the same folder (a unique name opened with
``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600, so neither a planted symlink nor a stale
temporary file is ever opened), which is then renamed over the key file: the rename
replaces a directory entry and never follows a link at the destination. Reading opens with
``O_NOFOLLOW`` and checks the opened file itself (no check-then-open race).
"""

from __future__ import annotations

import os
from pathlib import Path

from agent_blackbox.keystore._errors import KeyProviderError, UnsafeKeyFile
from agent_blackbox.schemas import (
    OTHERS_WRITE_FORBIDDEN,
    OWNER_ONLY_FORBIDDEN,
    read_checked_file,
    write_owner_only,
)

_NOT_OWNER = OWNER_ONLY_FORBIDDEN


def write_key_file(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` atomically, readable by its owner only.

    Raises:
        UnsafeKeyFile: ``path`` is a symbolic link or not a regular file.
        KeyProviderError: the folder cannot be written.
    """
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UnsafeKeyFile(
            f"{path} is a symbolic link or not a regular file; refusing to write a key "
            "there: remove it, or choose another path"
        )
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_owner_only(path, content)
    except OSError as exc:
        raise KeyProviderError(f"cannot write the key file {path}: {exc.strerror}") from exc


def read_key_file(path: Path) -> bytes:
    """The bytes of the key file ``path``.

    Raises:
        UnsafeKeyFile: ``path`` is a symbolic link, not a regular file, or can be read
            (or written) by its group or by others.
        KeyProviderError: ``path`` cannot be read.
    """
    return _read_checked(
        path,
        "key file",
        _NOT_OWNER,
        "is readable or writable by others (mode {mode}); restrict it to its owner with "
        "`chmod 600 {path}`",
    )


def _read_checked(path: Path, what: str, forbidden: int, refusal: str) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`read_checked_file`), refused
    with :class:`UnsafeKeyFile` when it is a link, not regular or has a ``forbidden`` bit."""
    return read_checked_file(
        path,
        what=what,
        forbidden=forbidden,
        refusal=refusal,
        unsafe=UnsafeKeyFile,
        unreadable=KeyProviderError,
    )


_OTHERS_WRITE = OTHERS_WRITE_FORBIDDEN


def write_public_file(path: Path, content: bytes) -> None:
    """Write the public key file ``path`` atomically (mode 0644: anyone may read it,
    only its owner change it), through the same unique temporary file as key files."""
    write_key_file(path, content)
    try:
        os.chmod(path, 0o644, follow_symlinks=False)
    except OSError as exc:
        raise KeyProviderError(f"cannot make {path} readable: {exc.strerror}") from exc


def read_public_file(path: Path) -> bytes:
    """The bytes of the public key file ``path``.

    Anyone may read a public key, but whoever can change it chooses whom new data keys
    are wrapped for: a file its group or others may write is refused.

    Raises:
        UnsafeKeyFile: ``path`` is a symbolic link, not a regular file, or writable by
            its group or by others.
        KeyProviderError: ``path`` cannot be read.
    """
    return _read_checked(
        path,
        "public key file",
        _OTHERS_WRITE,
        "can be changed by others (mode {mode}), who could swap in their own key; "
        "`chmod 644 {path}`",
    )
