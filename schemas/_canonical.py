"""Canonical JSON and the digests computed over it.

Canonical JSON is the only thing agent-blackbox hashes: keys sorted, no whitespace,
UTF-8, integers as integers, NaN and infinities rejected. Python's ``repr`` is never
hashed, so a digest means the same thing in every process and every language.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from schemas._errors import NotSerialisable

JsonValue: TypeAlias = (
    bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
)

DIGEST_PREFIX = "sha256:"


def canonical_json(value: Any, *, path: str = "$") -> bytes:
    """Return the canonical JSON encoding of ``value``.

    Raises:
        NotSerialisable: naming the path of the first value that is not JSON
            (an object, bytes, a non-string key, NaN or an infinity).
    """
    _check(value, path)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_text(value: Any, *, path: str = "$") -> str:
    """Canonical JSON as text, for fields of Avro bodies that carry JSON."""
    return canonical_json(value, path=path).decode("utf-8")


def digest(value: Any, *, path: str = "$") -> str:
    """SHA-256 over the canonical JSON of ``value``, as ``sha256:<hex>``."""
    return digest_bytes(canonical_json(value, path=path))


def digest_bytes(data: bytes) -> str:
    """SHA-256 over raw bytes, as ``sha256:<hex>``."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def _check(value: Any, path: str) -> None:
    # Walk before dumping so the error can name where the bad value sits; json's own
    # TypeError names only the type.
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotSerialisable(path, f"{value!r} is not a finite number")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotSerialisable(path, f"key {key!r} is a {type(key).__name__}, not a str")
            _check(item, f"{path}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    raise NotSerialisable(path, f"a {type(value).__name__} is not JSON-serialisable")
