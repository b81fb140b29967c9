"""The version 3 detectors: version 2's, sharper where version 2 missed or over-matched.

What changed from :mod:`._shapes` (which stays as it was, for runs recorded under it):

- ``email``: internationalised addresses (letters and marks of any script, ``xn--``
  top-level domains), and only with a real domain: a file extension is no top-level
  domain (``logo@2x.png``), and neither is an image-density suffix (``@2x``, ``@1.5x``)
  or a version number (``pkg@1.2.3-rc.beta``) a domain.
- ``card_number``: digits grouped by spaces, dashes, dots or slashes are a card when
  they pass the issuer and Luhn checks (the grouping is the context); one bare run of
  digits is a card only near a word that says so (``card``, ``visa``, ``cc``,
  ``paid with``, a ``card_number`` field...): an order number or a 63-bit id passes the
  issuer and Luhn checks as often as one in thirty.
- ``credential_pair``: the quotes of JSON escaped once or more (``{\\"password\\": ...``),
  as JSON encoded inside a JSON string shows them.

The rest (private keys, key shapes, bearer tokens, passwords in URLs, phone numbers) are
version 2's patterns and checks. Every pattern runs on RE2, in time linear in the text,
over the text's UTF-8 bytes (RE2's Python wrapper maps a ``str``'s offsets at a cost per
match several times the match's), and no pattern has a capturing group (a match with
groups costs RE2 a second, slower pass): a check finds the parts of a match itself.
Checks of a few characters around a match (the words near a card number) use Python's
engine on a bounded slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._detectors import DIGITS
from agent_blackbox.outbox._placeholders import CREDENTIAL, PLACEHOLDER_PREFIX
from agent_blackbox.outbox._shapes import (
    _KEY_HINTS,
    _KEY_SHAPES,
    _NAME_WORDS,
    BEARER_PATTERN,
    PHONE_PATTERN,
    PRIVATE_KEY_PATTERN,
    Finder,
    Shape,
    _joined,
    _phone_check,
    _token_check,
    _whole,
    _word_before,
    is_card_v2,
    is_secret_name,
)
from agent_blackbox.outbox._text_views import folded, normalised

_FILE_EXTENSIONS = frozenset(
    # File name extensions that are no top-level domain (those that are, such as .zip,
    # .mov, .md, .py, .pl, .pt or .rs, are left to the other checks).
    word
    for line in (
        "png jpg jpeg gif webp svg bmp tif tiff ico heic heif avif psd raw pdf txt csv",
        "tsv json jsonl ndjson xml yaml yml toml ini cfg conf html htm xhtml css scss",
        "less js mjs cjs jsx tsx ts rb java kt kts scala swift php lua dart vue svelte",
        "ipynb sql db sqlite log lock bak tmp tar tgz gz xz zst rar jar war whl egg deb",
        "rpm dmg iso exe dll bin dat obj wav ogg oga flac aac webm mkv avi wmv flv woff",
        "ttf otf eot map doc docx xls xlsx ppt pptx odt ods odp rtf epub parquet avro",
        "orc pkl npy npz onnx ckpt safetensors h hpp c cpp cxx cs go",
    )
    for word in line.split()
)
# An address: letters, marks and digits of any script (NFKC has folded the text), a
# domain of such labels, and a top-level domain of letters or in its ``xn--`` form.
_EMAIL = (
    r"[\p{L}\p{M}\p{N}._%+-]+@(?:[\p{L}\p{M}\p{N}-]+\.)+"
    r"(?:xn--[A-Za-z0-9-]{2,}|[\p{L}\p{M}]{2,})"
)


class _At:
    """A match's span, read the way version 2's checks read a match."""

    __slots__ = ("_end", "_start")

    def __init__(self, start: int, end: int) -> None:
        self._start, self._end = start, end

    def span(self) -> tuple[int, int]:
        return self._start, self._end

    def start(self) -> int:
        return self._start

    def end(self) -> int:
        return self._end


_Check = Callable[[str, int, int], "tuple[int, int] | None"]
"""Confirms a match (the text, where the match starts and ends) and gives the span to
replace, or None."""


def _v2(check: Callable[[str, Any], tuple[int, int] | None]) -> _Check:
    """A version 2 check (given a match object) as a version 3 one."""
    return lambda text, start, end: check(text, _At(start, end))


def _byte_spans(compiled: Any, data: bytes) -> Iterator[tuple[int, int]]:
    """The spans of ``compiled``'s matches in ``data``, left to right.

    Calls the engine's matcher under the wrapper when it is there: the wrapper's
    ``finditer`` builds a match object a match, which costs more than the match when a
    crafted text holds one every few characters. Same spans, same order (a test checks)."""
    regexp = getattr(compiled, "_regexp", None)
    anchor = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if regexp is None or anchor is None:  # another wrapper version: its public path
        for match in compiled.finditer(data):
            yield match.span()
        return
    at, end = 0, len(data)
    while True:
        start, stop = regexp.Match(anchor, data, at, end)[0]
        if start < 0:
            return
        yield start, stop
        if at == end:
            return
        at = at + 1 if stop == at else stop


def matches(compiled: Any, text: str) -> Iterator[tuple[int, int]]:
    """The spans of ``compiled``'s matches in ``text``, matched over its UTF-8 bytes and
    mapped back to character offsets in one pass."""
    if text.isascii():
        return _byte_spans(compiled, text.encode())
    return _char_spans(compiled, text.encode("utf-8", "surrogatepass"))


# Each byte of a UTF-8 text as 1 when it continues a character, else 0: the characters
# before a byte offset are the bytes before it less the continuation bytes among them.
_CONTINUATION = bytes(1 if 0x80 <= byte < 0xC0 else 0 for byte in range(256))


def _char_spans(compiled: Any, data: bytes) -> Iterator[tuple[int, int]]:
    """:func:`_byte_spans` of a UTF-8 text as character offsets (counted, not decoded:
    a crafted text may hold a match every few characters)."""
    continuing = data.translate(_CONTINUATION)
    count = continuing.count
    at_byte = at_char = 0
    for start_byte, end_byte in _byte_spans(compiled, data):
        start = at_char + (start_byte - at_byte) - count(1, at_byte, start_byte)
        at_char = start + (end_byte - start_byte) - count(1, start_byte, end_byte)
        at_byte = end_byte
        yield start, at_char


def _finder(pattern: str, check: _Check, *, joins: str | None = None) -> Finder:
    """A finder running ``pattern`` once over a string; ``check`` confirms each match
    and gives the span to replace. With ``joins``, a match may not follow a letter, a
    digit or one of ``joins`` unless it follows the previous match directly (as version
    2's finders)."""
    compiled = re2.compile(pattern)

    def find(text: str) -> list[tuple[int, int]]:
        # The loop runs once a match, and a crafted text may hold one every few
        # characters: what it can learn once (are there placeholders at all?) it does.
        found: list[tuple[int, int]] = []
        placeholders = PLACEHOLDER_PREFIX in text
        for start, end in matches(compiled, text):
            span = check(text, start, end)
            if span is None:
                continue
            at = span[0]
            if placeholders and text.startswith(PLACEHOLDER_PREFIX, at):
                continue
            if joins is None or not _joined(text, at, joins, found):
                found.append(span)
        return found

    return find


@lru_cache(maxsize=4096)
def is_real_domain(domain: str) -> bool:
    """Whether an e-mail address's domain can be one: its top-level domain is no file
    extension, and it is neither an image-density suffix nor a version number."""
    labels = domain.lower().split(".")
    if labels[-1] in _FILE_EXTENSIONS:
        return False
    head = ".".join(labels[:-1])
    if head.endswith("x") and head[:-1].replace(".", "", 1).isdigit():
        return False  # icon@2x.zip, hero@1.5x.mov
    # Two numeric labels first: a version (pkg@1.2.3-rc.beta) or an address, not a name.
    return not (len(labels) > 2 and labels[0].isdigit() and labels[1].isdigit())


def _email_check(text: str, start: int, end: int) -> tuple[int, int] | None:
    if end < len(text) and (text[end].isalnum() or text[end] == "-"):
        return None
    return (start, end) if is_real_domain(text[text.rindex("@", start, end) + 1 : end]) else None


# A word that says a number near it is a card's: card fields and words, networks, and
# how a payment is told. Letters around it may not continue it ("discard", "company").
# Python's engine: it runs on a slice of at most _CONTEXT_BEFORE characters.
_CARD_WORDS = re.compile(
    r"(?:^|[^a-z])(?:cards?|cardnumber|cardno|creditcard|debitcard|credit|debit|visa"
    r"|mastercard|master card|amex|american express|discover|maestro|jcb|unionpay|diners"
    r"|cc|ccn|ccnum|pan|paid with|pay with|paying with|charged to)(?:[^a-z]|$)"
)
_CONTEXT_BEFORE = 40
_CONTEXT_AFTER = 16


def card_words_near(text: str, start: int, end: int) -> bool:
    """Whether a word that names a card is within a few words of ``text[start:end]``."""
    before = text[max(0, start - _CONTEXT_BEFORE) : start].lower()
    after = text[end : end + _CONTEXT_AFTER].lower()
    return _CARD_WORDS.search(before) is not None or _CARD_WORDS.search(after) is not None


def _card_check(text: str, start: int, end: int) -> tuple[int, int] | None:
    if start > 0 and (_word_before(text, start) or text[start - 1] in "+.-"):
        return None
    if end < len(text) and (text[end].isalnum() or text[end] == "_"):
        return None
    span = text[start:end]
    grouped = not span.isdigit()
    # More groups after: a longer number (a bare run may end in a decimal part: a float).
    follows = ("-", ".", "/") if grouped else ("-",)
    if text[end : end + 1] in follows and text[end + 1 : end + 2].isdigit():
        return None
    digits = span.replace(" ", "").replace("-", "").replace(".", "").replace("/", "")
    if not is_card_v2(digits):
        return None
    return (start, end) if grouped or card_words_near(text, start, end) else None


_CARD_TOKENS = frozenset(
    {"card", "cards", "cardnumber", "cardno", "cardnum", "creditcard", "debitcard", "cc"}
    | {"ccn", "ccnum", "pan", "visa", "mastercard", "amex"}
)
_CARD_SIBLINGS = frozenset(
    {"cvv", "cvc", "cvv2", "cvc2", "exp_month", "exp_year", "expiry", "expiration"}
    | {"expiry_date", "expiration_date", "card_holder", "cardholder"}
)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")


@lru_cache(maxsize=4096)
def _name_tokens(key: str) -> tuple[str, ...]:
    name = _CAMEL.sub(r"\1_\2", key).lower()
    return tuple(token for token in re.split(r"[^a-z0-9]+", name) if token)


def is_card_field(key: object) -> bool:
    """Whether a mapping key names a card number (``card``, ``cardNumber``, ``cc_num``,
    ``pan``, ``credit_card``...): a number under it needs no other context."""
    return isinstance(key, str) and not _CARD_TOKENS.isdisjoint(_name_tokens(key))


def holds_card_fields(mapping: Mapping[Any, Any]) -> bool:
    """Whether a mapping is a card's details (it has a ``cvc``, an ``exp_month``...), so
    its ``number`` is a card number."""
    for key in mapping:  # noqa: SIM110 -- a loop: any() over a generator costs more
        if isinstance(key, str) and _is_card_sibling(key):
            return True
    return False


@lru_cache(maxsize=4096)
def _is_card_sibling(key: str) -> bool:
    return "_".join(_name_tokens(key)) in _CARD_SIBLINGS


_SEPARATORS = str.maketrans("", "", " -./")


def is_card_value(value: object) -> bool:
    """Whether a value found where a card number is expected is one: digits, grouped or
    not, or a number (a float past 2**53 lost its last digits: any of 13 to 19 digits)."""
    if type(value) is int:
        return is_card_v2(str(value))
    if type(value) is float:
        if not value.is_integer() or not 1e12 <= value < 1e19:
            return False
        return value >= 2**53 or is_card_v2(str(int(value)))
    if isinstance(value, str) and len(value) <= 32:
        digits = value.strip().translate(_SEPARATORS)
        return digits.isascii() and digits.isdigit() and is_card_v2(digits)
    return False


_NAME_BREAKS = re.compile(r"[\r\n\t\x0b\x0c]")


@lru_cache(maxsize=4096)
def is_secret_name_v3(key: str) -> bool:
    """Whether a mapping key names a credential (version 3): version 2's test, on the key
    normalised, with look-alike letters folded, line breaks and tabs taken out, and
    percent-escapes decoded (``api%5Fkey``, ``pass\\nword``, ``api_key\\ufe0f``)."""
    name = folded(normalised(key))
    name = unquote(unquote(_NAME_BREAKS.sub("", name)))
    return is_secret_name(name)


# The name (the run of name characters a match starts with), then what comes between it
# and the value: an optional quote (escaped or not), the ``=`` or ``:`` and another.
_PAIR_HEAD = re.compile(r"([A-Za-z0-9_.-]*)(?:\\{0,7}[\"'])?[ \t]*[=:][ \t]*(?:\\{0,7}[\"'])?")


def _pair_check(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The value of a ``name=value`` whose name is a credential's. The pattern has no
    groups: the name is the run of name characters the match starts with, the value
    what follows the ``=`` or ``:`` and an opening quote (escaped or not)."""
    if end - start > _PAIR_MEMO_CHARS:
        return _pair_value(text, start, end)
    # The answer depends on the match's characters alone, and a crafted text repeats
    # one pair thousands of times: each distinct pair is checked once.
    found = _pair_value_memo(text[start:end])
    return None if found is None else (start + found[0], start + found[1])


_PAIR_MEMO_CHARS = 256


@lru_cache(maxsize=4096)
def _pair_value_memo(pair: str) -> tuple[int, int] | None:
    return _pair_value(pair, 0, len(pair))


def _pair_value(text: str, start: int, end: int) -> tuple[int, int] | None:
    head = _PAIR_HEAD.match(text, start, end)
    if head is None:  # the pattern matched these parts: never, but then no value
        return None
    if not is_secret_name(text[start : head.end(1)]):
        return None
    value_start = head.end()
    # An escaped closing quote (\" of JSON inside JSON) ends the value, not its backslash.
    while end > value_start + 1 and text[end - 1] == "\\":
        end -= 1
    return (value_start, end) if value_start < end else None


def _userinfo_check(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The password of ``scheme://user:password@``: after the first ``:`` past ``//``."""
    colon = text.index(":", text.index("://", start, end) + 3, end)
    return colon + 1, end - 1


_QUOTE = r"(?:\\{0,7}[\"'])?"
CREDENTIAL_PAIR_PATTERN = (
    rf"(?i)[A-Za-z0-9_.-]*(?:{_NAME_WORDS})[A-Za-z0-9_.-]*{_QUOTE}[ \t]*[=:][ \t]*"
    rf"{_QUOTE}[^\s&#\"',;<>{{}}()\[\]]+"
)
"""A ``name=value`` (or ``name: value``, quoted or not) whose name holds a credential's
word; :func:`_pair_check` says whether the whole name is one."""

SHAPES_V3: Mapping[str, Shape] = MappingProxyType(
    {
        "private_key": Shape(
            _finder(PRIVATE_KEY_PATTERN, _v2(_whole)),
            ("private key",),
            "private_key",
        ),
        "api_key": Shape(_finder(_KEY_SHAPES, _v2(_whole), joins="_"), _KEY_HINTS, "api_key"),
        "bearer_token": Shape(
            _finder(BEARER_PATTERN, _v2(_token_check)), ("bearer", "basic"), "bearer_token"
        ),
        "url_userinfo": Shape(
            _finder(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:[^\s/@]+@", _userinfo_check),
            ("://",),
            CREDENTIAL,
        ),
        "credential_pair": Shape(
            _finder(CREDENTIAL_PAIR_PATTERN, _pair_check),
            tuple(_NAME_WORDS.split("|")),
            CREDENTIAL,
        ),
        "email": Shape(_finder(_EMAIL, _email_check, joins="._%+-"), ("@",), "email"),
        "card_number": Shape(
            # 13 to 19 digits in one block or in the groups cards print (4-4-4-4..7,
            # 4-6-5, 4-6-4), grouped by spaces, dashes, dots or slashes.
            _finder(
                r"\b(?:\d{13,19}|\d{4}[ ./-]\d{4}[ ./-]\d{4}[ ./-]\d{1,7}"
                r"|\d{4}[ ./-]\d{6}[ ./-]\d{4,5})\b",
                _card_check,
            ),
            DIGITS,
            "card_number",
        ),
        "phone": Shape(_finder(PHONE_PATTERN, _v2(_phone_check), joins="_+.-"), DIGITS, "phone"),
    }
)
"""Every version 3 detector, in the order they run over a string (version 2's names)."""

__all__ = [
    "SHAPES_V3",
    "card_words_near",
    "holds_card_fields",
    "is_card_field",
    "is_card_value",
    "is_real_domain",
    "matches",
]
