"""A backup store in a folder of the local file system (a laptop, a mounted volume)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from agent_blackbox.backup._store import ObjectMissing, StoreError, check_key
from agent_blackbox.schemas import write_owner_only


class FolderStore:
    """Objects as files under ``root``, a key's segments as subfolders.

    Each object is written to a temporary file in its folder (a name starting with a dot,
    never listed), flushed to disk and then renamed over its name, so a reader sees the
    whole object or none of it; objects are readable by their owner only.

    Args:
        root: The folder; created on the first write when it does not exist.
    """

    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise StoreError(f"a backup folder must be an absolute path, not {str(root)!r}")
        self._root = root

    @property
    def root(self) -> Path:
        """The folder the objects are in."""
        return self._root

    def describe(self) -> str:
        """``file://`` and the folder."""
        return f"file://{self._root}"

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` (atomically: a temporary file renamed over it)."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_owner_only(path, data)
            _sync_folder(path.parent)
        except OSError as exc:
            raise StoreError(
                f"could not write {key!r} to {self.describe()}: {exc.strerror or exc}; check "
                "that the folder is writable and the disk has room"
            ) from exc

    def get(self, key: str) -> bytes:
        """The bytes under ``key``."""
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectMissing(key, self.describe()) from exc
        except OSError as exc:
            raise StoreError(
                f"could not read {key!r} from {self.describe()}: {exc.strerror or exc}"
            ) from exc

    def keys(self, prefix: str = "") -> Iterator[str]:
        """The keys under ``prefix``, in ascending order."""
        check_key(prefix, prefix=True)
        found: list[str] = []
        for folder, subfolders, files in os.walk(self._root):
            subfolders[:] = [name for name in subfolders if not name.startswith(".")]
            base = Path(folder).relative_to(self._root).as_posix()
            for name in files:
                if name.startswith("."):
                    continue  # a write in progress, or not ours
                key = name if base == "." else f"{base}/{name}"
                if key.startswith(prefix):
                    found.append(key)
        return iter(sorted(found))

    def delete(self, key: str) -> None:
        """Remove the file under ``key`` (nothing to do when there is none)."""
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(
                f"could not delete {key!r} from {self.describe()}: {exc.strerror or exc}"
            ) from exc

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*check_key(key).split("/"))


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries to disk, so that a rename in it survives a crash."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
