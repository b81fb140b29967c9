"""The version 1 detectors: what redaction looked for before version 2, kept as it was.

Runs recorded under version 1 rules (rules recorded without a ``version``) are redacted
by these detectors again in replay, so they must never change: a change would make those
runs diverge. Their checks of a candidate (the Luhn sum, digit groups, what makes a token)
serve version 2 too. New runs use :mod:`agent_blackbox.outbox._shapes`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

CREDENTIAL_KEYS = frozenset(
    {"authorization", "proxy_authorization", "cookie", "set_cookie"}
    | {"api_key", "apikey", "x_api_key", "api_token", "openai_api_key", "anthropic_api_key"}
    | {"access_token", "refresh_token", "id_token", "session_token", "auth_token", "x_auth_token"}
    | {"secret", "secret_key", "client_secret", "aws_secret_access_key", "private_key"}
    | {"password", "passwd", "passphrase"}
)
"""Mapping keys (normalised: lower case, ``-`` and spaces as ``_``) whose whole value is a
credential. ``token`` alone is not one: LLM responses use it for text tokens."""


@dataclass(frozen=True, slots=True)
class Detector:
    """Finds sensitive substrings of strings.

    ``pattern`` (no capturing groups) finds candidates; ``accepts``, when set, confirms a
    candidate where a regex alone cannot (a Luhn check, a digit count). The rest only
    saves time and must hold for every match: it begins with a character of the class
    ``starts``, and holds one of ``hints`` (in the lower-cased string when ``folded``).
    Looking for a substring costs a fraction of running the regex, and most strings hold
    no hint at all.
    """

    pattern: str
    starts: str
    hints: tuple[str, ...]
    accepts: Callable[[str], bool] | None = None
    folded: bool = False


def luhn(digits: str) -> bool:
    """Whether ``digits`` (ASCII digits only) pass the Luhn check of card numbers."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        digit = ord(char) - 48
        if position % 2:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def _is_card(span: str) -> bool:
    return luhn(span.replace(" ", "").replace("-", ""))


DIGIT_GROUPS = re.compile(r"\d+")


def is_phone(span: str) -> bool:
    """Whether a candidate phone number has the digits and the shape of one."""
    groups = tuple(len(group) for group in DIGIT_GROUPS.findall(span))
    if not 7 <= sum(groups) <= 15:
        return False
    # A national number has a trunk prefix 0, an area code in parentheses or the North
    # American 3-3-4 shape; other digit groups ("10 20 30 40", 192.168.10.20) are data.
    return span[0] in "+0(" or groups == (3, 3, 4)


_PLAIN_WORDS = re.compile(r"[A-Za-z]+(?:[-.][A-Za-z]+)*")


def is_token(span: str) -> bool:
    """Whether the last word of a ``Bearer``/``Basic`` candidate is a token, not prose."""
    # "Basic Authentication" is prose, "Basic dXNlcjpwYXNz" is a credential: a token has
    # a digit or a symbol, or mixes cases the way a word does not.
    token = span.split()[-1]
    if not _PLAIN_WORDS.fullmatch(token):
        return True
    return not all(w.islower() or w.isupper() or w.istitle() for w in re.split(r"[-.]", token))


DIGITS = tuple("0123456789")
_KEY_END = r"(?![A-Za-z0-9_-])"
# National numbers: two or more groups of two or more digits, which leaves out plain
# numbers, decimals and versions (3.11.4), and not starting with a date (2026-12-02).
_NATIONAL = (
    r"(?!\d{4}[ ./-]\d\d[ ./-]\d\d(?!\d)|\d\d[ ./-]\d\d[ ./-]\d{4}(?!\d))"
    r"(?:\(\d\d++\)|\d\d++)(?:[ .-]?(?:\(\d\d++\)|\d\d++))+"
)
DETECTORS: Mapping[str, Detector] = MappingProxyType(
    {
        "bearer_token": Detector(
            r"\b(?i:bearer|basic)\s+[A-Za-z0-9\-._~+/]{7,}[A-Za-z0-9\-_~+/]=*",
            "Bb",
            ("bearer", "basic"),
            is_token,
            folded=True,
        ),
        "api_key": Detector(
            r"\b(?:sk-(?:proj-)?[A-Za-z0-9_-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
            r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
            r"|xox[baprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}"
            # JSON web tokens: three base64url parts, the first an encoded '{"'.
            r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})" + _KEY_END,
            "sAgxe",
            ("sk-", "AKIA", "ASIA", "_", "xox", "AIza", "eyJ"),
        ),
        "email": Detector(
            r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]++@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}"
            r"(?![A-Za-z0-9-])",
            r"A-Za-z0-9._%+\-",
            ("@",),
        ),
        # A leading 0 is no card's and is how padded ids and fillers start.
        "card_number": Detector(
            r"(?<![\w+.-])[1-9](?:[ -]?\d){12,18}(?!\w|-\d)", "1-9", DIGITS, _is_card
        ),
        # Possessive digit runs: each group is a whole run, so matching stays linear.
        "phone": Detector(
            rf"(?<![\w+.-])(?:\+\d++(?:[ .-]?(?:\(\d++\)|\d++))*|{_NATIONAL})(?![\w:])",
            "0-9+(",
            DIGITS,
            is_phone,
        ),
    }
)
"""Every named detector, in the order they are tried at one position of a string."""

DEFAULT_DETECTORS: tuple[str, ...] = tuple(DETECTORS)
ALWAYS_ON: tuple[str, ...] = ("api_key", "bearer_token")
"""Detectors applied whatever the configuration says."""


def is_credential_key(key: object) -> bool:
    """Whether a mapping key names a credential (version 1): one of :data:`CREDENTIAL_KEYS`."""
    return isinstance(key, str) and _is_credential_name(key)


# Memoised because the same few keys ("args", "kwargs", "role") come in every event, and
# normalising costs more than the lookup. It is pure, so the cache changes no result.
@lru_cache(maxsize=4096)
def _is_credential_name(key: str) -> bool:
    return key.lower().replace("-", "_").replace(" ", "_") in CREDENTIAL_KEYS


def combine(names: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern trying the detectors ``names`` in turn, each as a group of its name."""
    # The leading class lets the engine pass over most positions at once, rather than
    # trying every alternative (and its lookbehind) at each.
    starts = "".join(DETECTORS[name].starts for name in names)
    alternatives = "|".join(f"(?P<{name}>{DETECTORS[name].pattern})" for name in names)
    return re.compile(f"(?=[{starts}])(?:{alternatives})")
