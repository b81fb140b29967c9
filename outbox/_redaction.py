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

import json
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._errors import RedactionConfigError
from agent_blackbox.outbox._placeholders import (
    CREDENTIAL,
    PLACEHOLDER_PREFIX,
    PSEUDONYM_HEX,
    PSEUDONYMOUS,
    StandIns,
    placeholder,
    pseudonym,
)
from agent_blackbox.schemas import (
    MAX_VALUE_DEPTH,
    canonical_text,
    deepest_path,
    too_deep,
)

# The module's names from before its parts had modules of their own; the package's public
# ones are re-exported from agent_blackbox.outbox.
__all__ = [
    "ALWAYS_ON",
    "ALWAYS_ON_V2",
    "CREDENTIAL",
    "CREDENTIAL_KEYS",
    "DEFAULT_DETECTORS",
    "DETECTORS",
    "OVERSIZE",
    "PLACEHOLDER_PREFIX",
    "PSEUDONYMOUS",
    "PSEUDONYM_HEX",
    "REDACTION_VERSION",
    "SCAN_CAP",
    "SHAPES",
    "VERSIONS",
    "Detector",
    "Finder",
    "Redacted",
    "RedactionConfigError",
    "Redactor",
    "Shape",
    "placeholder",
    "pseudonym",
]

REDACTION_VERSION = 2
"""The detector set new runs are recorded with (``version`` in the recorded rules). Rules
recorded without a version are version 1: the detectors of that time, kept as they were
so that old runs replay."""
VERSIONS = (1, 2)


def _windows(value: str) -> Iterator[str]:
    """``value`` in consecutive pieces of at most :data:`SCAN_CAP` characters, each cut
    just after whitespace when there is some near its end."""
    start = 0
    while start < len(value):
        end = min(start + SCAN_CAP, len(value))
        if end < len(value):
            space = max(value.rfind(c, end - _CUT_SEARCH, end) for c in " \n\t\r")
            if space > start:
                end = space + 1
        yield value[start:end]
        start = end


CREDENTIAL_KEYS = frozenset(
    {"authorization", "proxy_authorization", "cookie", "set_cookie"}
    | {"api_key", "apikey", "x_api_key", "api_token", "openai_api_key", "anthropic_api_key"}
    | {"access_token", "refresh_token", "id_token", "session_token", "auth_token", "x_auth_token"}
    | {"secret", "secret_key", "client_secret", "aws_secret_access_key", "private_key"}
    | {"password", "passwd", "passphrase"}
)
"""Mapping keys (normalised: lower case, ``-`` and spaces as ``_``) whose whole value is a
credential. ``token`` alone is not one: LLM responses use it for text tokens."""


class _TooDeep(Exception):
    """Raised inside a walk that went past :data:`MAX_VALUE_DEPTH`; :meth:`Redactor.redact`
    turns it into ``NotSerialisable`` naming the path (the walk keeps no paths)."""


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

    __slots__ = (
        "_any_hint",
        "_card_ints",
        "_detectors",
        "_gates",
        "_paths",
        "_patterns",
        "_pseudonyms",
        "_shapes",
        "_stand_ins",
        "_version",
    )

    def __init__(
        self,
        *,
        detectors: Iterable[str] = DEFAULT_DETECTORS,
        paths: Iterable[str] = (),
        pseudonyms: Iterable[str] = (),
        version: int | None = None,
    ) -> None:
        version = REDACTION_VERSION if version is None else version
        if version not in VERSIONS:
            raise RedactionConfigError(
                f"unknown redaction version {version!r}; known: {', '.join(map(str, VERSIONS))}"
            )
        self._version = version
        known_detectors = DETECTORS if version == 1 else SHAPES
        if any(isinstance(names, str) for names in (detectors, paths, pseudonyms)):
            raise RedactionConfigError(
                "detectors, paths and pseudonyms are lists of strings, not a string"
            )
        chosen = set(ALWAYS_ON if version == 1 else ALWAYS_ON_V2)
        for name in detectors:
            if not isinstance(name, str) or name not in known_detectors:
                known = ", ".join(known_detectors)
                raise RedactionConfigError(f"unknown redaction detector {name!r}; known: {known}")
            chosen.add(name)
        # The declaration order, never the configured one, decides which detector wins.
        self._detectors = tuple(name for name in known_detectors if name in chosen)
        parsed = {path: _parse_path(path) for path in paths}
        self._paths: _Live = tuple(sorted((f"path:{p}", rest) for p, rest in parsed.items()))
        if version == 1:
            self._gates = tuple(
                (n, DETECTORS[n].hints, DETECTORS[n].folded) for n in self._detectors
            )
        else:
            self._gates = ()
        self._shapes = tuple(SHAPES[n] for n in self._detectors) if version > 1 else ()
        hints = sorted({hint for shape in self._shapes for hint in shape.hints}, key=len)
        self._any_hint = re.compile("|".join(map(re.escape, reversed(hints))) or "(?!)")
        self._card_ints = "card_number" in chosen
        self._pseudonyms = _pseudonym_rules(pseudonyms, chosen, bool(parsed))
        self._stand_ins = StandIns(self._pseudonyms)
        # One combined pattern per set of detectors a string's hints call for, compiled on
        # first use: there are at most 2**5, and most strings need the same few.
        self._patterns: dict[tuple[str, ...], re.Pattern[str]] = {}

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, default_version: int = REDACTION_VERSION
    ) -> Redactor:
        """Build from ``{"detectors": [...], "paths": [...]}``; both keys are optional,
        and so is ``version`` (the detector set: ``default_version`` when absent; rules
        recorded before versions existed are read with ``default_version=1``).

        Raises:
            RedactionConfigError: naming the unknown key, detector or malformed path.
        """
        if not isinstance(config, Mapping):
            raise RedactionConfigError("redaction config must be an object with detectors, paths")
        unknown = sorted(set(config) - {"detectors", "paths", "pseudonyms", "version"})
        if unknown:
            raise RedactionConfigError(
                f"unknown redaction config key {unknown[0]!r}; expected 'detectors', 'paths', "
                "'pseudonyms' and 'version'"
            )
        version = config.get("version", default_version)
        if type(version) is not int:
            raise RedactionConfigError(
                f"redaction config 'version' must be an integer (one of "
                f"{', '.join(map(str, VERSIONS))}), not {version!r}"
            )
        lists = {key: config.get(key, []) for key in ("detectors", "paths", "pseudonyms")}
        for key, items in lists.items():
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise RedactionConfigError(f"redaction config {key!r} must be a list of strings")
        if "detectors" in config:
            detectors: Iterable[str] = lists["detectors"]
        else:
            detectors = DEFAULT_DETECTORS if version == 1 else tuple(SHAPES)
        return cls(
            detectors=detectors,
            paths=lists["paths"],
            pseudonyms=lists["pseudonyms"],
            version=version,
        )

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
    def config(self) -> dict[str, Any]:
        """What :meth:`from_config` takes to build this same redactor again (the key
        aside; ``pseudonyms`` only when there are any, so rules without them read as
        they always did; ``version`` past 1 only, so version 1 rules read as before)."""
        paths = sorted(name.removeprefix("path:") for name, _ in self._paths)
        config: dict[str, Any] = {"detectors": list(self._detectors), "paths": paths}
        if self._pseudonyms:
            config["pseudonyms"] = sorted(self._pseudonyms)
        if self._version > 1:
            config["version"] = self._version
        return config

    @property
    def version(self) -> int:
        """The detector set in force (:data:`REDACTION_VERSION` for new runs)."""
        return self._version

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
        copy = Redactor.from_config(self.config, default_version=self._version)
        copy._stand_ins = StandIns(copy._pseudonyms, key)
        return copy

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """The rules of ``BLACKBOX_REDACTION_FILE``, or every detector by default."""
        path = (os.environ if environ is None else environ).get("BLACKBOX_REDACTION_FILE")
        return cls.from_file(Path(path)) if path else cls()

    def inert(self, value: Any, depth: int = 0) -> bool:
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
        if self._version > 1 and kind is not list and kind is not tuple:
            return kind in _INERT_SCALARS
        if kind in _INERT_SCALARS:
            return True
        if kind is list or kind is tuple:
            if depth >= MAX_VALUE_DEPTH:
                return False  # redact() names where it is too deep
            for item in value:  # noqa: SIM110 -- a loop: all() over a generator costs more
                if not self.inert(item, depth + 1):
                    return False
            return True
        return False

    def redact(self, value: Any, *, path: str = "$") -> Redacted:
        """Return a redacted deep copy of ``value`` (tuples become lists); never mutates it.

        Raises:
            NotSerialisable: lists and mappings in ``value`` nest deeper than
                :data:`~agent_blackbox.schemas.MAX_VALUE_DEPTH` (naming where, from
                ``path``, the value's own name).
        """
        fired: set[str] = set()
        try:
            redacted = self._walk(value, self._paths, fired, 0, 0)
        except _TooDeep:
            raise too_deep(deepest_path(value, path=path) or path) from None
        return Redacted(redacted, tuple(sorted(fired)))

    def _walk(self, value: Any, live: _Live, fired: set[str], depth: int, level: int) -> Any:
        # depth: how many JSON strings deep this value was parsed from; level: how deeply
        # it sits in lists and mappings (bounded, so no value can exhaust the stack).
        if isinstance(value, str):
            if len(value) < _MIN_LENGTH:
                return value
            if self._version == 1:
                return self._scrub(value, fired)
            return self._string(value, fired, depth, level)
        if isinstance(value, dict | list | tuple) and level >= MAX_VALUE_DEPTH:
            raise _TooDeep
        if isinstance(value, dict):
            return self._mapping(value, live, fired, depth, level + 1)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, live, fired, depth, level + 1)
        # type() rather than isinstance: True is an int, and never a card number.
        if type(value) is int and self._card_ints and value in _CARD_INTS and self._card(value):
            fired.add("card_number")
            return self._stand_ins.of("card_number", str(value))
        return value

    def _card(self, value: int) -> bool:
        return _luhn(str(value)) if self._version == 1 else _is_card_v2(str(value))

    def _credential_key(self, key: object) -> bool:
        if self._version == 1:
            return _is_credential_key(key)
        return isinstance(key, str) and _is_secret_name(key)

    def _child(
        self, key: object, item: Any, live: _Live, fired: set[str], depth: int, level: int
    ) -> Any:
        if live:
            live, ended = _advance(live, key)
            if ended:
                fired.update(ended)
                if self._stand_ins.pseudonymous("path"):
                    return self._stand_ins.of("path", canonical_text(item))
                return _PATH_PLACEHOLDER
        return self._walk(item, live, fired, depth, level)

    def _mapping(
        self, value: dict[Any, Any], live: _Live, fired: set[str], depth: int, level: int
    ) -> dict[Any, Any]:
        # A header as {"name": "Authorization", "value": "..."} hides its secret in "value".
        secret_value = self._credential_key(value.get("name")) and "value" in value
        # A language model's log-probabilities: {"token": "Hello", "logprob": -0.1}.
        text_token = self._version > 1 and "logprob" in value
        out: dict[Any, Any] = {}
        for key, item in value.items():
            credential = self._credential_key(key) and not (text_token and key == "token")
            if self._version > 1 and isinstance(key, str) and len(key) >= _MIN_LENGTH:
                key = self._key_of(key, out, fired)
            if credential or (secret_value and key == "value"):
                fired.add(CREDENTIAL)
                out[key] = _CREDENTIAL_PLACEHOLDER
            else:
                out[key] = self._child(key, item, live, fired, depth, level)
        return out

    def _key_of(self, key: str, out: Mapping[Any, Any], fired: set[str]) -> str:
        """A mapping key, scanned like any string; two keys redacted alike are told apart
        by a count, in the mapping's order."""
        scrubbed = self._text(key, fired)
        if scrubbed is key:
            return key
        candidate, count = scrubbed, 1
        while candidate in out:
            count += 1
            candidate = f"{scrubbed}#{count}"
        return candidate

    def _sequence(
        self,
        value: list[Any] | tuple[Any, ...],
        live: _Live,
        fired: set[str],
        depth: int,
        level: int,
    ) -> list[Any]:
        # A header as ["Authorization", "..."] keeps its name and loses its value.
        header = len(value) == 2 and self._credential_key(value[0])
        items = value[:1] if header else value
        # Path segments are strings; the index is only turned into one when a path needs it.
        out = [
            self._child(str(i) if live else i, item, live, fired, depth, level)
            for i, item in enumerate(items)
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

    def _string(self, value: str, fired: set[str], depth: int, level: int) -> str:
        """A string (version 2): JSON inside it parsed and scanned, else scanned as text;
        a string longer than :data:`SCAN_CAP` is scanned as text, window by window."""
        if len(value) > SCAN_CAP:
            return "".join(self._text(window, fired) for window in _windows(value))
        head = value.lstrip()[:1]
        if head in ("{", "[") and depth < _JSON_DEPTH:
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                parsed = None
            if isinstance(parsed, (dict, list)):
                inner: set[str] = set()
                try:
                    scrubbed = self._walk(parsed, (), inner, depth + 1, level)
                except _TooDeep:  # JSON nested too deeply to walk: scanned as text
                    return self._text(value, fired)
                if not inner:
                    return value
                fired.update(inner)
                return json.dumps(scrubbed, ensure_ascii=False)
        return self._text(value, fired)

    def _text(self, text: str, fired: set[str]) -> str:
        """``text`` with every version 2 detector applied, after NFKC normalisation with
        invisible characters removed and look-alike letters folded (for matching only).
        Unchanged when nothing fires; otherwise the normalised text, redacted."""
        if text.isascii():
            normal = folded = text
        else:
            normal = unicodedata.normalize("NFKC", text).translate(_INVISIBLE)
            folded = normal.translate(_LOOKALIKES)
        lowered = folded.lower()
        # A short string is first searched once for every hint at once: most hold none.
        if len(lowered) < _SHORT and self._any_hint.search(lowered) is None:
            return text
        shapes = [shape for shape in self._shapes if _holds(lowered, shape.hints)]
        hit = False
        # A placeholder ends a word, so it may let a detector match next to it that could
        # not before: rounds go on until one changes nothing (redacting twice is then
        # redacting once), and at most _ROUNDS of them, which keeps the work linear.
        for _ in range(_ROUNDS):
            changed = False
            for shape in shapes:
                spans = shape.find(folded)
                if spans:
                    normal, folded = self._replace_spans(shape.label, spans, normal, folded)
                    fired.add(shape.label)
                    changed = hit = True
            if not changed:
                break
        return normal if hit else text

    def _replace_spans(
        self, label: str, spans: list[tuple[int, int]], normal: str, folded: str
    ) -> tuple[str, str]:
        normal_parts: list[str] = []
        folded_parts: list[str] = []
        last = 0
        for start, end in spans:
            stand_in = self._stand_ins.of(label, normal[start:end])
            normal_parts += (normal[last:start], stand_in)
            folded_parts += (folded[last:start], stand_in)
            last = end
        return "".join((*normal_parts, normal[last:])), "".join((*folded_parts, folded[last:]))

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
        return self._stand_ins.of(name, match.group())


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


# --- Version 2: the detectors new runs are recorded with ---------------------------------
#
# Every pattern below runs on RE2, whose matching time is linear in the text whatever the
# pattern: a crafted model reply cannot stall the recorder. RE2 has no lookaround, so the
# boundaries the version 1 patterns asserted are checked on each match in Python; a match
# that fails its check is skipped whole, so the scan stays one pass.

SCAN_CAP = 1 << 20
"""Characters of one string scanned at once. A longer string (a large model reply, which
the recorder keeps whole: it was paid for, and replay must hand it back as it came) is
scanned in windows of about this size, cut at whitespace, which no secret shape spans
(a PEM key's lines are each their own match): the time stays linear in the length."""
_CUT_SEARCH = 4096
"""How far back from a window's end a cut looks for whitespace."""
OVERSIZE = "oversize"
"""Kept for rules that name it; no longer produced (long strings are scanned whole)."""
_ROUNDS = 3
_SHORT = 256
_JSON_DEPTH = 8
"""How deep JSON encoded inside strings is parsed and scanned; deeper, it is text."""

# Characters that render as nothing (zero-width, joiners, soft hyphen, direction marks):
# removed before matching, so a key split by them is still a key.
_INVISIBLE_RANGES = (range(0x200B, 0x2010), range(0x202A, 0x202F), range(0x2060, 0x206A))
_INVISIBLE = dict.fromkeys(
    [0x00AD, 0x034F, 0x180E, 0xFEFF, *(code for block in _INVISIBLE_RANGES for code in block)],
    None,
)
# Cyrillic and Greek letters drawn like Latin ones, one for one (so offsets still agree):
# matching runs on the folded text, replacements are made in the normalised one.
_LOOKALIKES = str.maketrans(
    "аеорсухіјѕԁһӏԛԝАВЕКМНОРСТХУІЈЅΑΒΕΖΗΙΚΜΝΟΡΤΥΧονι",
    "aeopcyxijsdhlqwABEKMHOPCTXYIJSABEZHIKMNOPTYXovi",
)

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
def _is_secret_name(key: str) -> bool:
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
    return (start, end) if _is_token(text[start:end]) else None


def _pair_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span(1)
    return match.span(2) if _is_secret_name(text[start:end]) else None


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


def _is_card_v2(digits: str) -> bool:
    """A card number: an issuer's prefix, a length that issuer gives, and the Luhn check.
    Ids of 13 to 19 digits (snowflakes, epoch microseconds) start where no issuer does."""
    for low, high, lengths in _RANGES:
        if len(digits) in lengths and low <= digits[: len(low)] <= high:
            return _luhn(digits)
    return False


_SEPARATORS = re.compile(r"[ -]")


def _card_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span()
    if start > 0 and (_word_before(text, start) or text[start - 1] in "+.-"):
        return None
    if end < len(text) and (text[end].isalnum() or text[end] == "_"):
        return None
    if text.startswith("-", end) and text[end + 1 : end + 2].isdigit():
        return None
    digits = text[start:end].replace(" ", "").replace("-", "")
    return (start, end) if _is_card_v2(digits) else None


def _phone_check(text: str, match: Any) -> tuple[int, int] | None:
    start, end = match.span()
    span = text[start:end]
    if end < len(text) and (text[end].isalnum() or text[end] in "_:"):
        return None
    if text[end : end + 1] in (" ", ".", "-") and text[end + 1 : end + 2].isdigit():
        return None  # more digit groups follow: a longer number, not a phone
    if span[0] == "+":
        return start, end  # the pattern counted 7 to 15 digits
    groups = tuple(len(g) for g in _GROUPS.findall(span))
    national = True
    if national and (len(groups) < 2 or min(groups) < 2 or groups[:3] in ((4, 2, 2), (2, 2, 4))):
        return None
    return (start, end) if _is_phone(span) else None


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
_NAME_WORDS = (
    "token|secret|passw|passphrase|pwd|pass|key|auth|cookie|credential|session|sig|pin|otp"
)
SHAPES: Mapping[str, Shape] = MappingProxyType(
    {
        "private_key": Shape(
            _spans(
                r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
                r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|\z)",
                _whole,
            ),
            ("private key",),
            "private_key",
        ),
        "api_key": Shape(
            _spans(_KEY_SHAPES, _whole, joins="_"),
            _KEY_HINTS,
            "api_key",
        ),
        "bearer_token": Shape(
            _spans(
                r"\b(?i:bearer|basic)\s+[A-Za-z0-9\-._~+/]{7,}[A-Za-z0-9\-_~+/]=*", _token_check
            ),
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
            _DIGITS,
            "card_number",
        ),
        "phone": Shape(
            _spans(
                # International, national (a trunk 0 or an area code in parentheses
                # first) or the 3-3-4 shape; _is_phone counts the digits.
                # Each repetition adds one digit: 7 to 15 of them, as in _is_phone.
                r"\+\d(?:[ .-]?\(?\d\)?){6,14}\b"
                r"|\b0\d(?:[ .-]?\(?\d\)?){5,13}\b|\(\d{2,}\)(?:[ .-]?\d){5,13}\b"
                r"|\b\d{3}[ .-]?\d{3}[ .-]?\d{4}\b",
                _phone_check,
                joins="_+.-",
            ),
            _DIGITS,
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
