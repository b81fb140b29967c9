"""Redaction: secrets and personal data are replaced before the first durable write.

A :class:`Redactor` walks a JSON value and returns a copy in which sensitive values are
typed placeholders (``[redacted:email]``), with the names of the rules that fired.
Digests are taken over the redacted value and replay runs the same redactor on the live
inputs, so redaction is a pure function: no clock, no randomness, and nothing that
depends on the order of a mapping's keys or of the configuration.

Credentials (by key name, and the ``bearer_token`` and ``api_key`` shapes) are always
redacted; no configuration turns them off.

Pseudonyms (opt-in per rule, for e-mails, phone numbers, card numbers and path rules)
replace a value by a stable, keyed placeholder (``[email:9f3a1c04be7d]``): the same value
gives the same placeholder in every run of a tenant, so code that compares redacted values
for equality behaves in replay as it did when recorded. The tag is an HMAC under a key
derived from the tenant's key in the key store: an unkeyed hash of an e-mail address
would be a dictionary attack away from the address, so pseudonyms need a key store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

from agent_blackbox.schemas import BlackboxError, canonical_text

PLACEHOLDER_PREFIX = "[redacted:"


def placeholder(rule: str) -> str:
    """The string that stands in for what ``rule`` removed, e.g. ``[redacted:email]``."""
    return f"{PLACEHOLDER_PREFIX}{rule}]"


PSEUDONYMOUS = ("card_number", "email", "path", "phone")
"""The rules that may replace values by pseudonyms; never credentials."""
PSEUDONYM_HEX = 12
"""Hex digits of a pseudonym's tag: 48 bits, so distinct values of one tenant collide
with odds near one in a million only past some 24,000 of them."""


def pseudonym(rule: str, value: str, key: bytes) -> str:
    """The stable placeholder of ``value`` found by ``rule``, keyed by ``key`` (the
    tenant's pseudonym key), e.g. ``[email:9f3a1c04be7d]``."""
    mac = hmac.new(key, f"{rule}\x00{value}".encode(), hashlib.sha256)
    return f"[{rule}:{mac.hexdigest()[:PSEUDONYM_HEX]}]"


CREDENTIAL = "credential"
CREDENTIAL_KEYS = frozenset(
    {"authorization", "proxy_authorization", "cookie", "set_cookie"}
    | {"api_key", "apikey", "x_api_key", "api_token", "openai_api_key", "anthropic_api_key"}
    | {"access_token", "refresh_token", "id_token", "session_token", "auth_token", "x_auth_token"}
    | {"secret", "secret_key", "client_secret", "aws_secret_access_key", "private_key"}
    | {"password", "passwd", "passphrase"}
)
"""Mapping keys (normalised: lower case, ``-`` and spaces as ``_``) whose whole value is a
credential. ``token`` alone is not one: LLM responses use it for text tokens."""


class RedactionConfigError(BlackboxError, ValueError):
    """A redaction configuration is unreadable, names an unknown detector or a bad path."""


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


def _luhn(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        digit = ord(char) - 48
        if position % 2:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def _is_card(span: str) -> bool:
    return _luhn(span.replace(" ", "").replace("-", ""))


_GROUPS = re.compile(r"\d+")


def _is_phone(span: str) -> bool:
    groups = tuple(len(group) for group in _GROUPS.findall(span))
    if not 7 <= sum(groups) <= 15:
        return False
    # A national number has a trunk prefix 0, an area code in parentheses or the North
    # American 3-3-4 shape; other digit groups ("10 20 30 40", 192.168.10.20) are data.
    return span[0] in "+0(" or groups == (3, 3, 4)


_PLAIN_WORDS = re.compile(r"[A-Za-z]+(?:[-.][A-Za-z]+)*")


def _is_token(span: str) -> bool:
    # "Basic Authentication" is prose, "Basic dXNlcjpwYXNz" is a credential: a token has
    # a digit or a symbol, or mixes cases the way a word does not.
    token = span.split()[-1]
    if not _PLAIN_WORDS.fullmatch(token):
        return True
    return not all(w.islower() or w.isupper() or w.istitle() for w in re.split(r"[-.]", token))


_DIGITS = tuple("0123456789")
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
            _is_token,
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
            r"(?<![\w+.-])[1-9](?:[ -]?\d){12,18}(?!\w|-\d)", "1-9", _DIGITS, _is_card
        ),
        # Possessive digit runs: each group is a whole run, so matching stays linear.
        "phone": Detector(
            rf"(?<![\w+.-])(?:\+\d++(?:[ .-]?(?:\(\d++\)|\d++))*|{_NATIONAL})(?![\w:])",
            "0-9+(",
            _DIGITS,
            _is_phone,
        ),
    }
)
"""Every named detector, in the order they are tried at one position of a string."""

DEFAULT_DETECTORS: tuple[str, ...] = tuple(DETECTORS)
ALWAYS_ON: tuple[str, ...] = ("api_key", "bearer_token")
"""Detectors applied whatever the configuration says."""

# The shortest string any detector can match is an e-mail like "a@b.io".
_MIN_LENGTH = 6
_CARD_INTS = range(10**12, 10**19)
_CREDENTIAL_PLACEHOLDER = placeholder(CREDENTIAL)
_INERT_SCALARS = frozenset({bool, float, type(None)})
_PATH_PLACEHOLDER = placeholder("path")

_Live: TypeAlias = tuple[tuple[str, tuple[str, ...]], ...]
"""Path rules still in play at a node: each rule's name and its segments left to match."""


def _is_credential_key(key: object) -> bool:
    return isinstance(key, str) and _is_credential_name(key)


# Memoised because the same few keys ("args", "kwargs", "role") come in every event, and
# normalising costs more than the lookup. It is pure, so the cache changes no result.
@lru_cache(maxsize=4096)
def _is_credential_name(key: str) -> bool:
    return key.lower().replace("-", "_").replace(" ", "_") in CREDENTIAL_KEYS


def _parse_path(path: object) -> tuple[str, ...]:
    if not isinstance(path, str) or not path:
        raise RedactionConfigError(f"redaction path {path!r} is not a non-empty string")
    segments = tuple(path.split("."))
    for segment in segments:
        if not segment or segment != segment.strip() or ("*" in segment and segment != "*"):
            raise RedactionConfigError(
                f"malformed redaction path {path!r}: segment {segment!r}; write dotted keys "
                "or list indexes, with '*' alone as a segment for any key or index"
            )
    return segments


def _advance(live: _Live, key: object) -> tuple[_Live, list[str]]:
    """The rules still in play below ``key``, and the names of those that end there."""
    below = tuple((name, rest[1:]) for name, rest in live if rest[0] in ("*", key))
    return tuple(rule for rule in below if rule[1]), [name for name, rest in below if not rest]


@dataclass(frozen=True, slots=True)
class Redacted:
    """A redacted deep copy of a value, and the sorted names of the rules that fired."""

    value: Any
    fired: tuple[str, ...]


class Redactor:
    """Replaces credentials, detected substrings and configured paths with placeholders.

    Args:
        detectors: names from :data:`DETECTORS`; :data:`ALWAYS_ON` ones apply regardless.
        paths: dotted paths from the root (``kwargs.customer.ssn``, ``messages.*.content``)
            whose whole value is replaced; ``*`` matches any key or list index.
        pseudonyms: rules (of :data:`PSEUDONYMOUS` in force; ``path`` for every path
            rule) whose values become keyed pseudonyms instead of ``[redacted:...]``.
            Such a redactor redacts only once given the tenant's key (:meth:`keyed`).

    Raises:
        RedactionConfigError: naming an unknown detector, a malformed path, or a
            pseudonym rule that is not in force or may not have pseudonyms.
    """

    __slots__ = ("_card_ints", "_detectors", "_gates", "_key", "_paths", "_patterns", "_pseudonyms")

    def __init__(
        self,
        *,
        detectors: Iterable[str] = DEFAULT_DETECTORS,
        paths: Iterable[str] = (),
        pseudonyms: Iterable[str] = (),
    ) -> None:
        if any(isinstance(names, str) for names in (detectors, paths, pseudonyms)):
            raise RedactionConfigError(
                "detectors, paths and pseudonyms are lists of strings, not a string"
            )
        chosen = set(ALWAYS_ON)
        for name in detectors:
            if not isinstance(name, str) or name not in DETECTORS:
                known = ", ".join(DETECTORS)
                raise RedactionConfigError(f"unknown redaction detector {name!r}; known: {known}")
            chosen.add(name)
        # The declaration order, never the configured one, decides which detector wins.
        self._detectors = tuple(name for name in DETECTORS if name in chosen)
        parsed = {path: _parse_path(path) for path in paths}
        self._paths: _Live = tuple(sorted((f"path:{p}", rest) for p, rest in parsed.items()))
        self._gates = tuple((n, DETECTORS[n].hints, DETECTORS[n].folded) for n in self._detectors)
        self._card_ints = "card_number" in chosen
        self._pseudonyms = _pseudonym_rules(pseudonyms, chosen, bool(parsed))
        self._key: bytes | None = None
        # One combined pattern per set of detectors a string's hints call for, compiled on
        # first use: there are at most 2**5, and most strings need the same few.
        self._patterns: dict[tuple[str, ...], re.Pattern[str]] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Redactor:
        """Build from ``{"detectors": [...], "paths": [...]}``; both keys are optional.

        Raises:
            RedactionConfigError: naming the unknown key, detector or malformed path.
        """
        if not isinstance(config, Mapping):
            raise RedactionConfigError("redaction config must be an object with detectors, paths")
        unknown = sorted(set(config) - {"detectors", "paths", "pseudonyms"})
        if unknown:
            raise RedactionConfigError(
                f"unknown redaction config key {unknown[0]!r}; expected 'detectors', 'paths' "
                "and 'pseudonyms'"
            )
        lists = {key: config.get(key, []) for key in ("detectors", "paths", "pseudonyms")}
        for key, items in lists.items():
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise RedactionConfigError(f"redaction config {key!r} must be a list of strings")
        detectors = lists["detectors"] if "detectors" in config else DEFAULT_DETECTORS
        return cls(detectors=detectors, paths=lists["paths"], pseudonyms=lists["pseudonyms"])

    @classmethod
    def from_file(cls, path: Path) -> Redactor:
        """Build from a JSON file holding what :meth:`from_config` takes.

        Raises:
            RedactionConfigError: saying which file, and what is wrong with it.
        """
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise RedactionConfigError(
                f"cannot read redaction config {path}: {exc.strerror or exc}; create it or "
                "point the recorder at an existing file"
            ) from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RedactionConfigError(
                f"redaction config {path} is not valid JSON ({exc}); it must hold "
                '{"detectors": [...], "paths": [...]}'
            ) from exc
        try:
            return cls.from_config(config)
        except RedactionConfigError as exc:
            raise RedactionConfigError(f"redaction config {path}: {exc}") from exc

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule name in force, sorted: what to record as the configuration used."""
        return tuple(sorted((CREDENTIAL, *self._detectors, *(n for n, _ in self._paths))))

    @property
    def config(self) -> dict[str, list[str]]:
        """What :meth:`from_config` takes to build this same redactor again (the key
        aside; ``pseudonyms`` only when there are any, so rules without them read as
        they always did)."""
        paths = sorted(name.removeprefix("path:") for name, _ in self._paths)
        config = {"detectors": list(self._detectors), "paths": paths}
        if self._pseudonyms:
            config["pseudonyms"] = sorted(self._pseudonyms)
        return config

    @property
    def pseudonymous(self) -> bool:
        """Whether some rule gives pseudonyms (and the redactor then needs a key)."""
        return bool(self._pseudonyms)

    def keyed(self, key: bytes) -> Redactor:
        """This redactor, its pseudonyms keyed by ``key`` (the tenant's pseudonym key).

        Raises:
            ValueError: the key is shorter than 32 bytes.
        """
        if len(key) < 32:
            raise ValueError("a pseudonym key needs at least 32 bytes")
        copy = Redactor.from_config(self.config)
        copy._key = key
        return copy

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """The rules of ``BLACKBOX_REDACTION_FILE``, or every detector by default."""
        path = (os.environ if environ is None else environ).get("BLACKBOX_REDACTION_FILE")
        return cls.from_file(Path(path)) if path else cls()

    def inert(self, value: Any) -> bool:
        """Whether no rule can fire anywhere in ``value``, checked far faster than
        :meth:`redact` runs: scalars, strings too short for any detector, and lists of
        them, when no path rule is configured. Mappings always go through :meth:`redact`
        (their keys may be credentials)."""
        if self._paths:
            return False
        kind = type(value)
        if kind is str:
            return len(value) < _MIN_LENGTH  # shorter than any credential name, too
        if kind is int:
            return not (self._card_ints and value in _CARD_INTS)
        if kind in _INERT_SCALARS:
            return True
        if kind is list or kind is tuple:
            for item in value:  # noqa: SIM110 -- a loop: all() over a generator costs more
                if not self.inert(item):
                    return False
            return True
        return False

    def redact(self, value: Any) -> Redacted:
        """Return a redacted deep copy of ``value`` (tuples become lists); never mutates it."""
        fired: set[str] = set()
        return Redacted(self._walk(value, self._paths, fired), tuple(sorted(fired)))

    def _walk(self, value: Any, live: _Live, fired: set[str]) -> Any:
        if isinstance(value, str):
            return self._scrub(value, fired) if len(value) >= _MIN_LENGTH else value
        if isinstance(value, dict):
            return self._mapping(value, live, fired)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, live, fired)
        # type() rather than isinstance: True is an int, and never a card number.
        if type(value) is int and self._card_ints and value in _CARD_INTS and _luhn(str(value)):
            fired.add("card_number")
            return self._stand_in("card_number", str(value))
        return value

    def _child(self, key: object, item: Any, live: _Live, fired: set[str]) -> Any:
        if live:
            live, ended = _advance(live, key)
            if ended:
                fired.update(ended)
                if "path" in self._pseudonyms:
                    return self._stand_in("path", canonical_text(item))
                return _PATH_PLACEHOLDER
        return self._walk(item, live, fired)

    def _mapping(self, value: dict[Any, Any], live: _Live, fired: set[str]) -> dict[Any, Any]:
        # A header as {"name": "Authorization", "value": "..."} hides its secret in "value".
        secret_value = _is_credential_key(value.get("name")) and "value" in value
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if _is_credential_key(key) or (secret_value and key == "value"):
                fired.add(CREDENTIAL)
                out[key] = _CREDENTIAL_PLACEHOLDER
            else:
                out[key] = self._child(key, item, live, fired)
        return out

    def _sequence(
        self, value: list[Any] | tuple[Any, ...], live: _Live, fired: set[str]
    ) -> list[Any]:
        # A header as ["Authorization", "..."] keeps its name and loses its value.
        header = len(value) == 2 and _is_credential_key(value[0])
        items = value[:1] if header else value
        # Path segments are strings; the index is only turned into one when a path needs it.
        out = [
            self._child(str(i) if live else i, item, live, fired) for i, item in enumerate(items)
        ]
        if header:
            fired.add(CREDENTIAL)
            out.append(_CREDENTIAL_PLACEHOLDER)
        return out

    def _scrub(self, text: str, fired: set[str]) -> str:
        # Most strings hold nothing: no regex runs, no copy is made. Otherwise substitute
        # until a pass changes nothing, so redacting twice is the same as redacting once.
        # It ends: placeholders match no detector, so each pass leaves fewer candidates.
        pattern = self._pattern_for(text)
        if pattern is None or pattern.search(text) is None:
            return text
        hits: list[str] = []
        replace = partial(self._replace, hits=hits)
        while True:
            # The first pattern still serves: a placeholder may hold a hint, never a match.
            text = pattern.sub(replace, text)
            if not hits:
                return text
            fired.update(hits)
            hits.clear()

    def _pattern_for(self, text: str) -> re.Pattern[str] | None:
        """The combined pattern of the detectors whose hints ``text`` holds, if any."""
        lowered = text.lower()
        names = []
        for name, hints, folded in self._gates:
            if _holds(lowered if folded else text, hints):
                names.append(name)
        if not names:
            return None
        key = tuple(names)
        pattern = self._patterns.get(key)
        if pattern is None:
            pattern = self._patterns[key] = _combine(key)
        return pattern

    def _replace(self, match: re.Match[str], hits: list[str]) -> str:
        name = str(match.lastgroup)  # every alternative is a named group
        accepts = DETECTORS[name].accepts
        if accepts is not None and not accepts(match.group()):
            return match.group()
        hits.append(name)
        return self._stand_in(name, match.group())

    def _stand_in(self, rule: str, value: str) -> str:
        """The placeholder of ``value``: typed, or the keyed pseudonym."""
        if rule not in self._pseudonyms:
            return placeholder(rule)
        if self._key is None:
            raise RedactionConfigError(
                f"the redaction rules give pseudonyms for {rule!r}, and pseudonyms are keyed "
                "by the tenant's key: record with a key store (BLACKBOX_KEK_FILE) so the "
                "recorder can key them (an unkeyed hash of a value such as an e-mail "
                "address is a dictionary attack away from the value)"
            )
        return pseudonym(rule, value, self._key)


def _pseudonym_rules(names: Iterable[str], detectors: set[str], paths: bool) -> frozenset[str]:
    chosen = frozenset(names)
    for name in sorted(chosen):
        if name not in PSEUDONYMOUS:
            raise RedactionConfigError(
                f"pseudonyms for {name!r} are not offered; choose among "
                f"{', '.join(PSEUDONYMOUS)} (credentials are always removed outright)"
            )
        if (name == "path" and not paths) or (name != "path" and name not in detectors):
            what = "no path rule is configured" if name == "path" else "its detector is off"
            raise RedactionConfigError(
                f"pseudonyms for {name!r} are asked for, but {what}; turn it on or drop it"
            )
    return chosen


def _combine(names: tuple[str, ...]) -> re.Pattern[str]:
    # The leading class lets the engine pass over most positions at once, rather than
    # trying every alternative (and its lookbehind) at each.
    starts = "".join(DETECTORS[name].starts for name in names)
    alternatives = "|".join(f"(?P<{name}>{DETECTORS[name].pattern})" for name in names)
    return re.compile(f"(?=[{starts}])(?:{alternatives})")


def _holds(text: str, hints: tuple[str, ...]) -> bool:
    # A plain loop: any() over a generator costs more than the searches themselves.
    for hint in hints:  # noqa: SIM110
        if hint in text:
            return True
    return False
