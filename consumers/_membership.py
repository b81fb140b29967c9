"""The default static member id of a consumer process: one per process on a host, the
same again after a restart."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent_blackbox.consumers._errors import ConsumerError

log = logging.getLogger(__name__)

MAX_SLOTS = 256


@contextmanager
def host_member_id(name: str, group: str, *, directory: Path | None = None) -> Iterator[str]:
    """``NAME@HOST`` for the first consumer ``name`` of ``group`` running on this host,
    ``NAME@HOST#2`` for a second one running at the same time, and so on.

    Each process holds a lock file for its slot while the block runs. The kernel releases
    the lock when the process ends, however it ends (kill -9 included), so a consumer
    started again takes the same slot, hence the same id, and the group hands it its
    partitions back at once; two consumers on one host never share an id.

    Raises:
        ConsumerError: every slot is taken.
    """
    host = socket.gethostname()
    folder = directory or Path(tempfile.gettempdir()) / f"blackbox-members-{os.getuid()}"
    key = hashlib.sha256(f"{group}\0{name}".encode()).hexdigest()[:16]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("no folder for member slots (%s); joining as %s@%s", exc, name, host)
        yield f"{name}@{host}"
        return
    for slot in range(1, MAX_SLOTS + 1):
        handle = (folder / f"{key}.{slot}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        try:
            yield f"{name}@{host}" if slot == 1 else f"{name}@{host}#{slot}"
        finally:
            handle.close()
        return
    raise ConsumerError(
        f"{MAX_SLOTS} consumers {name!r} of group {group!r} already run on this host; "
        "give this one its own --instance-id"
    )
