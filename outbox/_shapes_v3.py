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
version 2's. Every pattern runs on RE2, in time linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._detectors import DIGITS
from agent_blackbox.outbox._placeholders import CREDENTIAL
from agent_blackbox.outbox._shapes import (
    _NAME_WORDS,
    SHAPES,
    Shape,
    _spans,
    _word_before,
    is_card_v2,
    is_secret_name,
)
from agent_blackbox.outbox._text_views import LOOKALIKES, normalised

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
_DENSITY = re2.compile(r"(?i)\d+(?:[._]\d+)?x")
_VERSION_START = re2.compile(r"\d+\.\d+")
# An address: letters, marks and digits of any script (NFKC has folded the text), a
# domain of such labels, and a top-level domain of letters or in its ``xn--`` form.
_EMAIL = (
    r"[\p{L}\p{M}\p{N}._%+-]+@((?:[\p{L}\p{M}\p{N}-]+\.)+(?:xn--[A-Za-z0-9-]{2,}|[\p{L}\p{M}]{2,}))"
)


def is_real_domain(domain: str) -> bool:
    """Whether an e-mail address's domain can be one: its top-level domain is no file
    extension, and it is neither an image-density suffix nor a version number."""
    labels = domain.lower().split(".")
    if labels[-1] in _FILE_EXTENSIONS:
        return False
    head = ".".join(labels[:-1])
    if _DENSITY.fullmatch(head) is not None:
        return False  # icon@2x.zip, hero@1.5x.mov
    return _VERSION_START.match(domain) is None  # two numeric labels first: a version or IP


def _email_check(text: str, match: Any) -> tuple[int, int] | None:
    end = match.end()
    if end < len(text) and (text[end].isalnum() or text[end] == "-"):
        return None
    start, stop = match.span(1)
    if not is_real_domain(text[start:stop]):
        return None
    return match.span()  # type: ignore[no-any-return]


# A word that says a number near it is a card's: card fields and words, networks, and
# how a payment is told. Letters around it may not continue it ("discard", "company").
_CARD_WORDS = re2.compile(
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


def _card_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span()
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
    return any(
        isinstance(key, str) and "_".join(_name_tokens(key)) in _CARD_SIBLINGS for key in mapping
    )


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
    name = normalised(key)
    if not name.isascii():
        name = name.translate(LOOKALIKES)
    name = unquote(unquote(_NAME_BREAKS.sub("", name)))
    return is_secret_name(name)


def _pair_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span(1)
    if not is_secret_name(text[start:end]):
        return None
    value_start, value_end = match.span(2)
    # An escaped closing quote (\" of JSON inside JSON) ends the value, not its backslash.
    while value_end > value_start + 1 and text[value_end - 1] == "\\":
        value_end -= 1
    return value_start, value_end


_QUOTE = r"(?:\\{0,7}[\"'])?"

SHAPES_V3: Mapping[str, Shape] = MappingProxyType(
    {
        "private_key": SHAPES["private_key"],
        "api_key": SHAPES["api_key"],
        "bearer_token": SHAPES["bearer_token"],
        "url_userinfo": SHAPES["url_userinfo"],
        "credential_pair": Shape(
            _spans(
                rf"(?i)([A-Za-z0-9_.-]*(?:{_NAME_WORDS})[A-Za-z0-9_.-]*){_QUOTE}[ \t]*[=:][ \t]*"
                rf"{_QUOTE}([^\s&#\"',;<>{{}}()\[\]]+)",
                _pair_check,
            ),
            tuple(_NAME_WORDS.split("|")),
            CREDENTIAL,
        ),
        "email": Shape(_spans(_EMAIL, _email_check, joins="._%+-"), ("@",), "email"),
        "card_number": Shape(
            # 13 to 19 digits in one block or in the groups cards print (4-4-4-4..7,
            # 4-6-5, 4-6-4), grouped by spaces, dashes, dots or slashes.
            _spans(
                r"\b(?:\d{13,19}|\d{4}[ ./-]\d{4}[ ./-]\d{4}[ ./-]\d{1,7}"
                r"|\d{4}[ ./-]\d{6}[ ./-]\d{4,5})\b",
                _card_check,
            ),
            DIGITS,
            "card_number",
        ),
        "phone": SHAPES["phone"],
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
]
