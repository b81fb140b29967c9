"""RFC 8785, the JSON Canonicalization Scheme (JCS): what new runs hash.

JCS writes JSON as ECMAScript's ``JSON.stringify`` would, with the keys of every object
sorted by their UTF-16 code units:

- numbers are IEEE-754 doubles written in ECMAScript's shortest round-trip form
  (``1e-7``, ``0.00001``, ``1e+21``, ``2`` for ``2.0``, ``0`` for ``-0.0``);
- strings escape ``"`` and ``\\``, write U+0008, U+0009, U+000A, U+000C and U+000D as
  ``\\b \\t \\n \\f \\r``, the other control characters as ``\\u00xx`` (lowercase hex),
  and every other character as its UTF-8;
- no whitespace; ``null``, ``true`` and ``false`` as they are.

Where a Python value has no JSON form the serialiser refuses it with
:class:`NotSerialisable` naming its path, as the first canonical form does: NaN and the
infinities, a non-string key, a string holding a lone surrogate (not Unicode text, so
not I-JSON), a value nested deeper than :data:`MAX_VALUE_DEPTH`, any other type. An
integer is a JSON number, so it is written as the double nearest to it: exactly when
its magnitude is at most 2**53 (every integer an agent is likely to pass), as
ECMAScript would write the rounded double beyond that (what every JCS implementation
that reads the number from JSON text does), and refused past the largest double.

Written here rather than taken from a library: the one maintained pure-Python
implementation (``rfc8785``) refuses integers past 2**53 (so a run that recorded an
id of 64 bits would stop recording), does not name where a bad value sits, and writes
every value through Python code. Digests are taken on the agent's path for every
event, so the common value (strings, integers of at most 2**53, floats that both forms
write alike, keys whose code-point and UTF-16 orders agree) goes through the standard
library's C encoder, whose output is then byte for byte the JCS text; :func:`_write`
writes the rest (a request with ``temperature=1.0`` hands its messages to the C encoder
and writes the ``1`` itself), on a par with the first form's cost. The tests check both
paths against ``rfc8785`` and the published examples of the RFC, and the JVM consumer
checks digests of new runs with a Java implementation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from agent_blackbox.schemas._canonical import MAX_VALUE_DEPTH, not_unicode, too_deep
from agent_blackbox.schemas._errors import NotSerialisable

SAFE_INTEGER = 2**53
"""Integers of at most this magnitude are doubles exactly: written as their digits."""


def _unencodable(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON-serialisable")


# json's C encoder with sorted keys, no whitespace, text as it is: on the values
# _jcs_alike admits, its output is the JCS text.
_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _unencodable, encode_basestring, None, ":", ",", True, False, False)
)


def rfc8785_json(value: Any, *, path: str = "$") -> bytes:
    """The RFC 8785 (JCS) canonical JSON of ``value``, as UTF-8.

    Raises:
        NotSerialisable: naming the path of the first value that has no JSON form.
    """
    # Whatever the C encoder writes as JCS (the whole value, most often) goes through it.
    out: list[str] = []
    _write(value, path, 0, out, fast=_C_ENCODER is not None)
    text = "".join(out)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate: written again, checking every string, to name where.
        out = []
        _write(value, path, 0, out, fast=False)
        return "".join(out).encode("utf-8")


def es_number(value: float) -> str:
    """``value`` as ECMAScript writes a number (``Number.prototype.toString``).

    Python's ``repr`` gives the shortest digits that read back as the same double
    (the digits ECMAScript picks); only where the decimal point goes, and when to
    switch to an exponent, differ.

    Raises:
        ValueError: ``value`` is NaN or an infinity.
    """
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    if value == 0:
        return "0"  # -0.0 too
    text = float.__repr__(value)
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    # value = 0.<digits> x 10**point
    point = len(whole) + (int(exponent) if exponent else 0)
    significant = digits.lstrip("0")
    point -= len(digits) - len(significant)
    significant = significant.rstrip("0")
    count = len(significant)
    if count <= point <= 21:
        return sign + significant + "0" * (point - count)
    if 0 < point <= 21:
        return f"{sign}{significant[:point]}.{significant[point:]}"
    if -6 < point <= 0:
        return f"{sign}0.{'0' * -point}{significant}"
    power = point - 1
    exponent_text = f"e{'+' if power >= 0 else '-'}{abs(power)}"
    if count == 1:
        return sign + significant + exponent_text
    return f"{sign}{significant[0]}.{significant[1:]}{exponent_text}"


def utf16_key(key: str) -> bytes:
    """What JCS sorts object keys by: their UTF-16 code units (big-endian bytes compare
    as the units do)."""
    return key.encode("utf-16-be", "surrogatepass")


_SCALARS = frozenset({str, bool, type(None)})
_CONTAINERS = frozenset({dict, list, tuple})
_FIXED_BAND = (1e-4, 1e16)
"""Non-integral floats in this band of magnitudes: ``repr`` writes them in fixed
notation with the digits ECMAScript writes, so the C encoder's text is JCS."""


def jcs_alike(value: Any) -> bool:
    """Whether the JCS text of ``value`` is its version 1 canonical text (the standard
    library's C encoder, keys sorted, writes both alike): see :func:`_jcs_alike`."""
    return _C_ENCODER is not None and _jcs_alike(value)


def _jcs_alike(value: Any, depth: int = 0) -> bool:
    """Whether the C encoder's sorted, compact text of ``value`` is its JCS text: exact
    dicts, lists, tuples, str, bool, None; ints of at most 2**53; floats in
    :data:`_FIXED_BAND` that are not integral; keys whose code-point order is their
    UTF-16 order (no character from U+E000 on). Anything else is left to :func:`_write`.
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is int:
        return bool(-SAFE_INTEGER <= value <= SAFE_INTEGER)
    if kind is float:
        magnitude = abs(value)
        low, high = _FIXED_BAND
        return bool(low <= magnitude < high and not value.is_integer())
    if depth >= MAX_VALUE_DEPTH:
        return False
    if kind is dict:
        try:
            keys = "".join(value)  # every key a str, checked in one pass
        except TypeError:
            return False
        if not (keys.isascii() or max(keys) < "\ue000"):
            return False
        for item in value.values():
            if type(item) not in _SCALARS and not _jcs_alike(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _SCALARS and not _jcs_alike(item, depth + 1):
                return False
        return True
    return False


def _write(value: Any, path: str, depth: int, out: list[str], *, fast: bool = False) -> None:
    """Append the JCS text of ``value`` to ``out``; refuse what has none, naming where.
    With ``fast``, lists and mappings the C encoder writes as JCS are written by it, and
    strings are not checked for lone surrogates (the caller's encoding finds them)."""
    encoder = _C_ENCODER if fast else None
    if encoder is not None and type(value) in _CONTAINERS and _jcs_alike(value, depth):
        out.append("".join(encoder(value, 0)))
    elif value is None:
        out.append("null")
    elif value is True or value is False:
        out.append("true" if value else "false")
    elif isinstance(value, str):
        out.append(encode_basestring(value) if fast else _string(value, path))
    elif isinstance(value, int):
        out.append(_integer(value, path))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise NotSerialisable(path, f"{value!r} is not a finite number")
        out.append(es_number(float(value)))
    elif isinstance(value, Mapping | list | tuple) and depth >= MAX_VALUE_DEPTH:
        raise too_deep(path)
    elif isinstance(value, Mapping):
        _write_object(value, path, depth, out, fast=fast)
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, f"{path}[{index}]", depth + 1, out, fast=fast)
        out.append("]")
    else:
        raise NotSerialisable(path, f"a {type(value).__name__} is not JSON-serialisable")


def _write_object(
    value: Mapping[Any, Any], path: str, depth: int, out: list[str], *, fast: bool
) -> None:
    for key in value:
        if not isinstance(key, str):
            raise NotSerialisable(path, f"key {key!r} is a {type(key).__name__}, not a str")
        if not fast:
            _string(key, path, what="key")  # a key with a lone surrogate is refused here
    out.append("{")
    for index, key in enumerate(sorted(value, key=utf16_key)):
        if index:
            out.append(",")
        out.append(encode_basestring(key))
        out.append(":")
        _write(value[key], f"{path}.{key}", depth + 1, out, fast=fast)
    out.append("}")


def _string(value: str, path: str, *, what: str = "text") -> str:
    refused = not_unicode(value, path, what=what)
    if refused is not None:
        raise refused
    return str(encode_basestring(value))


def _integer(value: int, path: str) -> str:
    if -SAFE_INTEGER <= value <= SAFE_INTEGER:
        return int.__repr__(value)
    try:
        nearest = float(value)
    except OverflowError:
        raise NotSerialisable(
            path, f"an integer of {len(str(abs(value)))} digits is beyond the largest JSON number"
        ) from None
    return es_number(nearest)
