"""Reading a file that holds a secret (a key-encryption key, the signer's private key):
opened without following a link, and refused unless only its owner can read it.

It lives in the leaf package so every part that loads a key file (the key store, the
checkpoint signer) applies the same check; each names the file and raises its own error.
"""

from __future__ import annotations

import os
import stat
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
