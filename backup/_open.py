"""A backup store from its URL (``BLACKBOX_BACKUP_URL``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from agent_blackbox.backup._folder import FolderStore
from agent_blackbox.backup._s3 import S3Store
from agent_blackbox.backup._store import BACKUP_URL_ENV, BackupStore, StoreError

_S3_OPTIONS = ("endpoint", "region")
_FORMS = (
    "file:///absolute/folder, or s3://bucket/prefix (with ?endpoint=http://host:port for "
    "an S3-compatible store other than AWS, and &region=...)"
)


def open_store(url: str | None = None, *, environ: Mapping[str, str] | None = None) -> BackupStore:
    """The store ``url`` names, else ``BLACKBOX_BACKUP_URL``'s.

    - ``file:///path/to/folder``: a :class:`FolderStore`;
    - ``s3://bucket/optional/prefix?endpoint=http://127.0.0.1:29900&region=eu-west-1``:
      an :class:`S3Store` (credentials from ``AWS_ACCESS_KEY_ID`` /
      ``AWS_SECRET_ACCESS_KEY`` or boto3's other usual places, never the URL).

    Raises:
        StoreError: no URL, or one that names no store this project has (saying which
            forms there are).
    """
    env = os.environ if environ is None else environ
    given = url if url is not None else env.get(BACKUP_URL_ENV, "")
    if not given:
        raise StoreError(f"no backup store: set {BACKUP_URL_ENV} to {_FORMS}")
    parts = urlsplit(given)
    if parts.scheme == "file":
        return _folder(given, parts.netloc, parts.path, parts.query)
    if parts.scheme == "s3":
        return _s3(given, parts.netloc, parts.path, parts.query)
    raise StoreError(f"backup URL {_shown(given)!r} names no store this project has: {_FORMS}")


def _folder(url: str, host: str, path: str, query: str) -> FolderStore:
    if host not in ("", "localhost") or query or not path.startswith("/"):
        raise StoreError(
            f"backup URL {_shown(url)!r}: a folder is file:///absolute/path (three slashes, "
            "no host, no options)"
        )
    return FolderStore(Path(unquote(path)))


def _s3(url: str, bucket: str, path: str, query: str) -> S3Store:
    if not bucket:
        raise StoreError(f"backup URL {_shown(url)!r} names no bucket: s3://bucket/prefix")
    options = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(options) - set(_S3_OPTIONS))
    if unknown:
        raise StoreError(
            f"backup URL {_shown(url)!r}: unknown option {', '.join(unknown)} (it takes "
            f"{' and '.join(_S3_OPTIONS)}; credentials go in AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, never in the URL)"
        )
    single = {name: values[-1] for name, values in options.items()}
    endpoint = single.get("endpoint") or None
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise StoreError(f"backup URL {_shown(url)!r}: endpoint must be an http:// or https:// URL")
    prefix = unquote(path.lstrip("/"))
    return S3Store(bucket, prefix=prefix, endpoint=endpoint, region=single.get("region") or None)


def _shown(url: str) -> str:
    """``url`` without any user or password it carries, safe to print."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]).geturl()
