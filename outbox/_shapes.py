"""The version 2 detectors ("shapes"): what new runs are redacted with.

Every pattern here runs on RE2, whose matching time is linear in the text whatever the
pattern: a crafted model reply cannot stall the recorder. RE2 has no lookaround, so the
boundaries the version 1 patterns asserted are checked on each match in Python; a match
that fails its check is skipped whole, so the scan stays one pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, TypeAlias

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._detectors import (
    CREDENTIAL_KEYS,
    DIGIT_GROUPS,
    DIGITS,
    is_phone,
    is_token,
    luhn,
)
from agent_blackbox.outbox._placeholders import CREDENTIAL, PLACEHOLDER_PREFIX

_SECRET_NAME = re2.compile(
    r"token|secret|passw|passphrase|pwd|api_?key|apikey|authori[sz]ation|auth_?key|cookie"
    r"|credential|private_?key|subscription_?key|access_?key|account_?key|client_?key"
    r"|signing_?key|master_?key|encryption_?key|session_?(?:id|key)|signature"
    r"|^(?:auth|sig|pass|pin|otp)$"
)
# Names that hold "token" and are counts or text tokens of a language model, not secrets.
_TOKEN_COUNTS = re2.compile(
    r"tokens|tokeni[sz]\w*|token_(?:count|type|ids?|usage|limit|budget|logprobs?|index|str)"
)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NAME_SHAPE = re2.compile(r"[A-Za-z0-9_.:$ -]{1,80}")


@lru_cache(maxsize=4096)
def is_secret_name(key: str) -> bool:
    """Whether a mapping key or a ``name=`` names a credential (version 2): by pattern,
    after splitting camel case and folding ``-``, ``.`` and spaces to ``_``."""
    if _NAME_SHAPE.fullmatch(key) is None:
        return False  # prose, a placeholder or a value: not a name
    name = _CAMEL.sub(r"\1_\2", key).lower().replace("-", "_").replace(" ", "_")
    name = name.replace(".", "_")
    if name in CREDENTIAL_KEYS:
        return True
    return _SECRET_NAME.search(_TOKEN_COUNTS.sub("", name)) is not None


Finder: TypeAlias = Callable[[str], list[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class Shape:
    """A version 2 detector: ``find`` gives the spans to replace in a (folded) string,
    and runs only when the lower-cased string holds one of ``hints``; what it removes is
    recorded as ``label``."""

    find: Finder
    hints: tuple[str, ...]
    label: str


_Check: TypeAlias = Callable[[str, Any], "tuple[int, int] | list[tuple[int, int]] | None"]


def _spans(pattern: str, check: _Check, *, joins: str | None = None) -> Finder:
    """A finder running ``pattern`` once over a string; ``check`` confirms each match
    and gives the span to replace. With ``joins``, a match may not follow a letter, a
    digit or one of ``joins`` (it would be the tail of a longer word), unless it follows
    the previous match directly (as it will once that one is a placeholder)."""
    compiled = re2.compile(pattern)

    def find(text: str) -> list[tuple[int, int]]:
        # ASCII text is matched as bytes: the offsets are the same, and the engine's
        # wrapper maps no offsets back, which makes each match several times cheaper.
        found: list[tuple[int, int]] = []
        for match in compiled.finditer(text.encode() if text.isascii() else text):
            spans = check(text, match)
            if spans is None:
                continue
            for span in [spans] if isinstance(spans, tuple) else spans:
                if text.startswith(PLACEHOLDER_PREFIX, span[0]):
                    continue
                if joins is None or not _joined(text, span[0], joins, found):
                    found.append(span)
        return found

    return find


def _joined(text: str, start: int, joins: str, found: list[tuple[int, int]]) -> bool:
    """Whether a match at ``start`` is the tail of a longer word (and not right after the
    previous match)."""
    if not start or not (text[start - 1].isalnum() or text[start - 1] in joins):
        return False
    return not found or found[-1][1] != start


def _whole(_text: str, match: Any) -> tuple[int, int] | None:
    return match.span()  # type: ignore[no-any-return]


def _word_before(text: str, start: int) -> bool:
    return start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_")


def _token_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span()
    return (start, end) if is_token(text[start:end]) else None


def _pair_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span(1)
    return match.span(2) if is_secret_name(text[start:end]) else None


def _userinfo_check(text: str, match: Any) -> tuple[int, int] | None:
    return match.span(1)  # type: ignore[no-any-return]


def _email_check(text: str, match: Any) -> tuple[int, int] | None:
    end = match.end()
    if end < len(text) and (text[end].isalnum() or text[end] == "-"):
        return None
    return match.span()  # type: ignore[no-any-return]


_RANGES: tuple[tuple[str, str, frozenset[int]], ...] = (
    # Issuer identification ranges (lowest and highest prefix) and the lengths they issue.
    ("4", "4", frozenset({13, 16, 19})),
    ("51", "55", frozenset({16})),
    ("2221", "2720", frozenset({16})),
    ("34", "34", frozenset({15})),
    ("37", "37", frozenset({15})),
    ("6011", "6011", frozenset(range(16, 20))),
    ("644", "649", frozenset(range(16, 20))),
    ("65", "65", frozenset(range(16, 20))),
    ("3528", "3589", frozenset(range(16, 20))),
    ("300", "305", frozenset(range(14, 20))),
    ("36", "36", frozenset(range(14, 20))),
    ("38", "39", frozenset(range(16, 20))),
    ("62", "62", frozenset(range(16, 20))),
    ("2200", "2204", frozenset(range(16, 20))),
    ("5018", "5018", frozenset(range(12, 20))),
    ("5020", "5020", frozenset(range(12, 20))),
    ("5038", "5038", frozenset(range(12, 20))),
    ("5893", "5893", frozenset(range(12, 20))),
    ("6304", "6304", frozenset(range(12, 20))),
    ("6759", "6759", frozenset(range(12, 20))),
    ("6761", "6763", frozenset(range(12, 20))),
    ("60", "60", frozenset(range(16, 20))),
    ("81", "82", frozenset(range(16, 20))),
)


def is_card_v2(digits: str) -> bool:
    """A card number: an issuer's prefix, a length that issuer gives, and the Luhn check.
    Ids of 13 to 19 digits (snowflakes, epoch microseconds) start where no issuer does."""
    for low, high, lengths in _RANGES:
        if len(digits) in lengths and low <= digits[: len(low)] <= high:
            return luhn(digits)
    return False


def _card_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span()
    if start > 0 and (_word_before(text, start) or text[start - 1] in "+.-"):
        return None
    if end < len(text) and (text[end].isalnum() or text[end] == "_"):
        return None
    if text.startswith("-", end) and text[end + 1 : end + 2].isdigit():
        return None
    digits = text[start:end].replace(" ", "").replace("-", "")
    return (start, end) if is_card_v2(digits) else None


def _phone_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span()
    span = text[start:end]
    if end < len(text) and (text[end].isalnum() or text[end] in "_:"):
        return None
    if text[end : end + 1] in (" ", ".", "-") and text[end + 1 : end + 2].isdigit():
        return None  # more digit groups follow: a longer number, not a phone
    if span[0] == "+":
        return start, end  # the pattern counted 7 to 15 digits
    groups = tuple(len(g) for g in DIGIT_GROUPS.findall(span))
    if len(groups) < 2 or min(groups) < 2 or groups[:3] in ((4, 2, 2), (2, 2, 4)):
        return None  # one run of digits, a lone digit, or a date's shape
    return (start, end) if is_phone(span) else None


_KEY_SHAPES = (
    r"sk-[A-Za-z0-9_-]{20,}|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|gl(?:pat|ptt|dt|rt|cbt)-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}"
    r"|ya29\.[A-Za-z0-9_-]{20,}|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"
    r"|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}"
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}|dop_v1_[a-f0-9]{64}|shp(?:at|ss)_[a-fA-F0-9]{32}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{10,}"
    r"|https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]{20,}"
)
_KEY_HINTS: tuple[str, ...] = (
    "sk-",
    "sk_",
    "rk_",
    "whsec_",
    "akia",
    "asia",
    "gh",
    "gl",
    "hf_",
    "ya29.",
    "xox",
)
_KEY_HINTS += ("xapp-", "aiza", "npm_", "pypi-", "sg.", "eyj", "dop_v1_", "shp", "hooks.")
_KEY_HINTS += ("discord",)
PRIVATE_KEY_PATTERN = (
    r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
    r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|\z)"
)
BEARER_PATTERN = r"\b(?i:bearer|basic)\s+[A-Za-z0-9\-._~+/]{7,}[A-Za-z0-9\-_~+/]=*"
# International, national (a trunk 0 or an area code in parentheses first) or the 3-3-4
# shape; is_phone counts the digits. Each repetition adds one digit: 7 to 15 of them, as
# in is_phone.
PHONE_PATTERN = (
    r"\+\d(?:[ .-]?\(?\d\)?){6,14}\b"
    r"|\b0\d(?:[ .-]?\(?\d\)?){5,13}\b|\(\d{2,}\)(?:[ .-]?\d){5,13}\b"
    r"|\b\d{3}[ .-]?\d{3}[ .-]?\d{4}\b"
)
_NAME_WORDS = (
    "token|secret|passw|passphrase|pwd|pass|key|auth|cookie|credential|session|sig|pin|otp"
)
SHAPES: Mapping[str, Shape] = MappingProxyType(
    {
        "private_key": Shape(
            _spans(PRIVATE_KEY_PATTERN, _whole),
            ("private key",),
            "private_key",
        ),
        "api_key": Shape(
            _spans(_KEY_SHAPES, _whole, joins="_"),
            _KEY_HINTS,
            "api_key",
        ),
        "bearer_token": Shape(
            _spans(BEARER_PATTERN, _token_check),
            ("bearer", "basic"),
            "bearer_token",
        ),
        "url_userinfo": Shape(
            _spans(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:([^\s/@]+)@", _userinfo_check),
            ("://",),
            CREDENTIAL,
        ),
        # name=value, name: value, ?name=value&: the value goes when the name is one of a
        # credential (query strings, exception messages, logged headers, config dumps).
        "credential_pair": Shape(
            _spans(
                rf"(?i)([A-Za-z0-9_.-]*(?:{_NAME_WORDS})[A-Za-z0-9_.-]*)[\"']?[ \t]*[=:][ \t]*"
                r"[\"']?([^\s&#\"',;<>{}()\[\]]+)",
                _pair_check,
            ),
            tuple(_NAME_WORDS.split("|")),
            CREDENTIAL,
        ),
        "email": Shape(
            _spans(
                r"[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}",
                _email_check,
                joins="._%+-",
            ),
            ("@",),
            "email",
        ),
        "card_number": Shape(
            # The structure of a card number: 13 to 19 digits in one block or in the
            # groups cards print (4-4-4-4..7, 4-6-5, 4-6-4).
            _spans(
                r"\b(?:\d{13,19}|\d{4}[ -]\d{4}[ -]\d{4}[ -]\d{1,7}|\d{4}[ -]\d{6}[ -]\d{4,5})\b",
                _card_check,
            ),
            DIGITS,
            "card_number",
        ),
        "phone": Shape(
            _spans(PHONE_PATTERN, _phone_check, joins="_+.-"),
            DIGITS,
            "phone",
        ),
    }
)
"""Every version 2 detector, in the order they run over a string."""
ALWAYS_ON_V2: tuple[str, ...] = (
    "private_key",
    "api_key",
    "bearer_token",
    "url_userinfo",
    "credential_pair",
)
