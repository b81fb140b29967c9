"""Canonical JSON, version 1: what runs recorded before RFC 8785 hash, and how JSON
texts inside bodies are written.

Keys sorted by code point, no whitespace, UTF-8 unescaped, integers as their digits,
floats as Python's ``repr``, NaN and infinities rejected with the path named. Runs
started since hash RFC 8785 instead (:mod:`~agent_blackbox.schemas._digests` picks the
run's); body texts stay in this form, which reads back as the same Python value (a float
as a float), since replay hands those values back.

Ordered JSON (:func:`ordered_text`) is canonical JSON in everything but key order: each
mapping keeps its own. Bodies store the values replay hands back in it, so an agent gets
its dicts in the order it first got them (and ``json.dumps`` of one writes what it wrote
when recorded); their digests are still taken over canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, TypeAlias

from agent_blackbox.schemas._errors import NotSerialisable

JsonValue: TypeAlias = (
    bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
)

DIGEST_PREFIX = "sha256:"

MAX_VALUE_DEPTH = 100
"""How deeply lists and mappings may nest in a recorded value. Every walk over a value
(canonical JSON, the tagged encoding, redaction) refuses a deeper one with
:class:`NotSerialisable` instead of running out of stack; a fixed number, so a value
recorded is a value replayed, whatever the caller's stack depth. Redaction takes up to
four frames a level: 100 levels stay well inside Python's default recursion limit."""

# What json.dumps(value, **these options) builds on every call, built once.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _unencodable(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON-serialisable")


# The C encoder that _ENCODER.encode builds anew for every value, built once with the
# same options (no circular-reference markers: _plain has walked the value already).
_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _unencodable, encode_basestring, None, ":", ",", True, False, False)
)

# The same two for ordered JSON: every option as above but sort_keys.
_ORDERED_ENCODER = json.JSONEncoder(
    sort_keys=False, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_C_ORDERED_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _unencodable, encode_basestring, None, ":", ",", False, False, False)
)


def canonical_json(value: Any, *, path: str = "$") -> bytes:
    """Return the canonical JSON encoding of ``value``.

    Raises:
        NotSerialisable: naming the path of the first value that is not JSON
            (an object, bytes, a non-string key, NaN or an infinity).
    """
    if _C_ENCODER is not None and _plain(value):
        text = "".join(_C_ENCODER(value, 0))
    else:
        _check(value, path, 0)  # raises naming the path, or lets a subclass or Mapping through
        text = _ENCODER.encode(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _lone_surrogate(value, path) from None


def canonical_text(value: Any, *, path: str = "$") -> str:
    """Canonical JSON as text, for fields of Avro bodies that carry JSON."""
    return canonical_json(value, path=path).decode("utf-8")


def ordered_text(value: Any, *, path: str = "$") -> str:
    """The JSON text of ``value`` written as :func:`canonical_text` writes it, but with
    each mapping's keys in their own order: for the fields of Avro bodies that hold a
    value replay hands back. Its canonical JSON (``canonical_json(json.loads(text))``) is
    the canonical JSON of ``value``, so digests do not depend on which of the two a body
    stored; the text itself is canonical only where no mapping has its keys out of
    sorted order.

    Raises:
        NotSerialisable: as :func:`canonical_json`, for the same values.
    """
    if _C_ORDERED_ENCODER is not None and _plain(value):
        text = "".join(_C_ORDERED_ENCODER(value, 0))
    else:
        _check(value, path, 0)
        text = _ORDERED_ENCODER.encode(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _lone_surrogate(value, path) from None
    return text


LONE_SURROGATE_ADVICE = (
    "Replace it before it crosses a recorded boundary, for example with "
    "text.encode('utf-8', 'replace').decode('utf-8')"
)
"""What to do with a text that is not Unicode (a JSON text can decode to one)."""


def not_unicode(text: str, path: str, *, what: str = "text") -> NotSerialisable | None:
    """The refusal of ``text`` (at ``path``) when it holds a lone surrogate, which has no
    UTF-8 (nor a place in an Avro string); None when it is Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        return NotSerialisable(
            path,
            f"a {what} holds a lone surrogate (U+{code:04X}), which is not Unicode",
            LONE_SURROGATE_ADVICE,
        )
    return None


def _lone_surrogate(value: Any, path: str) -> NotSerialisable:
    """The refusal of ``value``, whose JSON text holds a lone surrogate, naming where."""
    found = _surrogate_at(value, path, 0)
    return found or NotSerialisable(
        path, "a text holds a lone surrogate, which is not Unicode", LONE_SURROGATE_ADVICE
    )


def _surrogate_at(value: Any, path: str, depth: int) -> NotSerialisable | None:
    """The refusal of the first string (or key) of ``value`` that holds a lone
    surrogate, naming its path."""
    if isinstance(value, str):
        return not_unicode(value, path)
    if depth >= MAX_VALUE_DEPTH:
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _surrogate_at(key, f"{path}.<key>", depth + 1) or _surrogate_at(
                item, f"{path}.{key}", depth + 1
            )
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _surrogate_at(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
    return None


def encoded_parts(values: Sequence[Any]) -> list[str] | None:
    """The canonical JSON texts of ``values``, each encoded without checking it first:
    only for the parts of a value whose canonical text was just taken (so every part is
    JSON), and whose caller compares the texts put back together with that text. None
    where the C encoder is missing."""
    if _C_ENCODER is None:
        return None
    return ["".join(_C_ENCODER(value, 0)) for value in values]


def plain_ordered_text(value: Any) -> str | None:
    """The :func:`ordered_text` of ``value`` when it is built of exactly dict, list, tuple,
    str, int, bool, None and finite floats with str keys, else None: a text that tells
    such values apart exactly (an int from a float, key order kept), so a cache of what
    is derived from a value can key on it. Tuples write as lists: a caller whose result
    differs between the two must not use it."""
    if _C_ORDERED_ENCODER is None or not _plain(value):
        return None
    return "".join(_C_ORDERED_ENCODER(value, 0))


def object_text(members: Mapping[str, str], *, code_point_keys: bool = True) -> str:
    """The canonical JSON of an object from the canonical texts of its members' values:
    keys sorted by code point (version 1), or by UTF-16 code units (RFC 8785)."""
    names = sorted(members) if code_point_keys else sorted(members, key=_utf16)
    return "{" + ",".join(f"{encode_basestring(k)}:{members[k]}" for k in names) + "}"


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


HMAC_PREFIX = "hmac-sha256:"


def digest_bytes(data: bytes) -> str:
    """SHA-256 over raw bytes, as ``sha256:<hex>``."""
    return DIGEST_PREFIX + _sha256(data).hexdigest()


_sha256 = hashlib.sha256


_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is built of exactly dict, list, tuple, str, int, bool, None and
    finite floats with str keys: the common case, which :func:`_check` always passes.

    Checking exact types, without building a path for every value, is several times
    faster than :func:`_check`; anything else (NaN, a subclass, another Mapping) is
    left to :func:`_check`, which names the path of a bad value (or of one nested deeper
    than :data:`MAX_VALUE_DEPTH`).
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is float:
        return math.isfinite(value)
    if depth >= MAX_VALUE_DEPTH:
        return False  # too deep for the fast path: _check names where
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain(item, depth + 1)):
                return False
        return True
    if kind is list or kind is tuple:
        # A loop, not all(): a generator costs more than the walk over a short list.
        for item in value:
            if type(item) not in _SCALARS and not _plain(item, depth + 1):
                return False
        return True
    return False


def _check(value: Any, path: str, depth: int) -> None:
    # Walk before dumping so the error can name where the bad value sits; json's own
    # TypeError names only the type.
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotSerialisable(path, f"{value!r} is not a finite number")
        return
    if isinstance(value, Mapping | list | tuple) and depth >= MAX_VALUE_DEPTH:
        raise too_deep(path)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotSerialisable(path, f"key {key!r} is a {type(key).__name__}, not a str")
            _check(item, f"{path}.{key}", depth + 1)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", depth + 1)
        return
    raise NotSerialisable(path, f"a {type(value).__name__} is not JSON-serialisable")


_PATH_SHOWN = 48


def too_deep(path: str) -> NotSerialisable:
    """The refusal of a value whose list or mapping at ``path`` lies deeper than
    :data:`MAX_VALUE_DEPTH` (a long path is shortened in the middle)."""
    shown = path if len(path) <= 2 * _PATH_SHOWN else f"{path[:_PATH_SHOWN]}…{path[-_PATH_SHOWN:]}"
    return NotSerialisable(
        shown,
        f"lists and mappings nest more than {MAX_VALUE_DEPTH} levels deep here (or one "
        "holds itself)",
        "Flatten the value, or record a summary of it (a count, a digest, the first levels), "
        "before it crosses a recorded boundary.",
    )


def deepest_path(value: Any, *, path: str = "$") -> str | None:
    """The path of the first list or mapping in ``value`` that lies deeper than
    :data:`MAX_VALUE_DEPTH`, or None; walked without recursion, so any depth is safe.
    For walks that count depth but not paths (redaction): they find the path here."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        current, where, depth = stack.pop()
        if isinstance(current, Mapping):
            children: list[tuple[Any, str]] = [(v, f"{where}.{k}") for k, v in current.items()]
        elif isinstance(current, list | tuple):
            children = [(v, f"{where}[{i}]") for i, v in enumerate(current)]
        else:
            continue
        if depth >= MAX_VALUE_DEPTH:
            return where
        stack.extend((child, at, depth + 1) for child, at in reversed(children))
    return None
