"""How hard a console token is to guess, estimated when the token file is loaded.

A token is what stands between the network and every run's metadata, so a token a
person made up (``password1234password1234``, ``correct-horse-battery-staple-42``) is
refused at start, naming its entry. The estimate charges each stretch of the token what
an attacker would pay to guess it: a character the full price of the alphabet its token
draws from (lower case, upper case, digits, symbols); a neighbour of the previous
character (``aaaa``, ``1234``, ``dcba``) one bit; a separator used before two bits; a
word from a short list of the words people put in passwords eight bits; a stretch of
letters that reads like a word (no three consonants or vowels in a row) about what a
dictionary word costs; a stretch that repeats an earlier one the price of pointing back
at it. Random tokens, such as :func:`new_token` makes, are far above
:data:`MIN_TOKEN_BITS` (``secrets.token_urlsafe(32)``: 180 bits or more, estimated).
"""

from __future__ import annotations

import math
import re
import secrets
import string

MIN_TOKEN_BITS = 100
"""The least estimated strength a console token may have (bits)."""
_COMMON = (
    "password", "passwd", "secret", "token", "admin", "letmein", "welcome", "qwerty",
    "asdf", "console", "blackbox", "changeme", "default", "login", "master", "dragon",
    "monkey", "iloveyou", "trustno1", "test", "guest", "root", "user", "abc",
)  # fmt: skip
_COMMON_BITS = 8.0
_WORDLIKE = re.compile(r"[A-Z]?[a-z]{2,}")
_UNSPEAKABLE = re.compile(r"[^aeiouy]{3}|[aeiouy]{3}", re.IGNORECASE)
_CLASSES = (
    string.ascii_lowercase,
    string.ascii_uppercase,
    string.digits,
    string.punctuation,
)


def new_token() -> str:
    """A fresh console token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def token_bits(token: str) -> float:
    """The estimated strength of ``token`` in bits (see the module's docstring)."""
    per_char = math.log2(_alphabet(token))
    bits, at, previous = 0.0, 0, ""
    while at < len(token):
        step, cost = _stretch(token, at, previous, per_char)
        bits += cost
        previous = token[at + step - 1]
        at += step
    return bits


def weakness(token: str) -> str | None:
    """Why ``token`` is too easy to guess, or None when it is strong enough."""
    bits = token_bits(token)
    if bits >= MIN_TOKEN_BITS:
        return None
    return (
        f"it is guessable (about {bits:.0f} bits where {MIN_TOKEN_BITS} are needed: "
        "words, repeats or sequences)"
    )


def _alphabet(token: str) -> int:
    size = sum(len(chars) for chars in _CLASSES if any(c in chars for c in token))
    others = {c for c in token if not any(c in chars for chars in _CLASSES)}
    return max(size + len(others), 2)


def _stretch(token: str, at: int, previous: str, per_char: float) -> tuple[int, float]:
    """How many characters from ``at`` the next stretch takes, and what it costs."""
    repeat = _repeat(token, at)
    if repeat >= 3:  # pointing back at an earlier stretch: where, and how long
        return repeat, math.log2(at + 1) + math.log2(repeat)
    lowered = token.lower()
    for common in _COMMON:
        if lowered.startswith(common, at):
            return len(common), _COMMON_BITS
    word = _word(token, at)
    if word:
        return word, min(word * per_char, 9.0 + 1.5 * word)
    if not token[at].isalnum() and token[at] in token[:at]:  # a separator used before
        return 1, 2.0
    if previous and abs(ord(token[at]) - ord(previous)) <= 1:
        return 1, 1.0
    return 1, per_char


def _word(token: str, at: int) -> int:
    """The length of the word-like stretch at ``at`` (0: none): two letters or more,
    lower case (the first may be a capital), that read like a word (no three consonants
    or three vowels in a row), starting where no letter precedes it."""
    found = _WORDLIKE.match(token, at)
    if found is None or token[at - 1 : at].isalpha() or _UNSPEAKABLE.search(found.group()):
        return 0
    return len(found.group())


def _repeat(token: str, at: int) -> int:
    """The length of the longest stretch from ``at`` that also starts earlier."""
    longest = 0
    for length in range(3, len(token) - at + 1):
        if token[at : at + length] not in token[: at + length - 1]:
            break
        longest = length
    return longest
