"""Reading a file that holds a secret (a key-encryption key, the signer's private key):
opened without following a link, and refused unless only its owner can read it; and
writing one (a key file, the local object store's credentials, a backup object) whole,
readable by its owner only.

It lives in the leaf package so every part that loads a key file (the key store, the
checkpoint signer) applies the same check; each names the file and raises its own error.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent_blackbox.schemas._errors import BlackboxError

OWNER_ONLY_FORBIDDEN = 0o077
"""Mode bits that let anyone but the owner read, write or run a file holding a secret."""

OTHERS_WRITE_FORBIDDEN = 0o022
"""Mode bits that let anyone but the owner change a file (a public key)."""


def read_checked_file(
    path: Path,
    *,
    what: str,
    forbidden: int,
    refusal: str,
    unsafe: Callable[[str], BlackboxError],
    unreadable: Callable[[str], BlackboxError],
) -> bytes:
    """The bytes of the regular file ``path``, opened without following a link.

    Arguments:
        what: how messages name the file ("key file", "signing key file").
        forbidden: mode bits the file must not have.
        refusal: why a file with a forbidden bit is refused; ``{mode}`` and ``{path}``
            are filled in.
        unsafe: makes the error for a symbolic link, a file that is not regular or one
            with a forbidden bit.
        unreadable: makes the error for a file that cannot be opened.

    The mode is checked on the opened descriptor, so nothing can be swapped in between
    the check and the read.
    """
    # O_NONBLOCK: a FIFO planted at the path is refused below instead of hanging the open.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        if path.is_symlink():
            raise unsafe(
                f"the {what} {path} is a symbolic link; refusing to follow it: point the "
                "setting at the file itself"
            ) from exc
        raise unreadable(f"cannot read the {what} {path}: {exc.strerror}") from exc
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise unsafe(f"the {what} {path} is not a regular file; point at the file")
        if mode & forbidden:
            shown = f"{stat.S_IMODE(mode):04o}"
            raise unsafe(f"the {what} {path} " + refusal.format(mode=shown, path=path))
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as source:
        return source.read()


def write_owner_only(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, readable and writable by its owner only.

    The bytes go to a new file of a random name beside ``path`` (created 0600, with
    ``O_EXCL``, never following a link: it never exists with wider permissions), are
    flushed to disk, and the file is renamed over ``path``: a reader sees the old file or
    the whole new one. A failed write leaves no temporary file behind.

    Raises:
        OSError: as the system gave it; the caller names the file in its own error.
    """
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(descriptor, "wb") as out:
            os.fchmod(out.fileno(), 0o600)  # a strict umask may have narrowed it further
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
