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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from agent_blackbox.outbox._detectors import (
    ALWAYS_ON,
    CREDENTIAL_KEYS,
    DEFAULT_DETECTORS,
    DETECTORS,
    Detector,
    is_credential_key,
    luhn,
)
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
from agent_blackbox.outbox._redaction_rules import (
    REDACTION_VERSION,
    VERSIONS,
    PathRules,
    RedactionRules,
)
from agent_blackbox.outbox._shapes import (
    ALWAYS_ON_V2,
    SHAPES,
    Finder,
    Shape,
    is_card_v2,
    is_secret_name,
)
from agent_blackbox.outbox._text_scan import (
    OVERSIZE,
    SCAN_CAP,
    PatternScan,
    ShapeScan,
    TextScan,
    windows,
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


class _TooDeep(Exception):
    """Raised inside a walk that went past :data:`MAX_VALUE_DEPTH`; :meth:`Redactor.redact`
    turns it into ``NotSerialisable`` naming the path (the walk keeps no paths)."""


# The shortest string any detector can match is an e-mail like "a@b.io".
_MIN_LENGTH = 6
_CARD_INTS = range(10**12, 10**19)
_CREDENTIAL_PLACEHOLDER = placeholder(CREDENTIAL)
_INERT_SCALARS = frozenset({bool, float, type(None)})
_PATH_PLACEHOLDER = placeholder("path")

_Live: TypeAlias = PathRules
"""Path rules still in play at a node: each rule's name and its segments left to match."""


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

    __slots__ = ("_card_ints", "_paths", "_rules", "_scan", "_stand_ins", "_version")

    def __init__(
        self,
        *,
        detectors: Iterable[str] = DEFAULT_DETECTORS,
        paths: Iterable[str] = (),
        pseudonyms: Iterable[str] = (),
        version: int | None = None,
    ) -> None:
        rules = RedactionRules.build(
            detectors=detectors, paths=paths, pseudonyms=pseudonyms, version=version
        )
        self._setup(rules, None)

    @classmethod
    def _of(cls, rules: RedactionRules, key: bytes | None = None) -> Redactor:
        redactor = cls.__new__(cls)
        redactor._setup(rules, key)
        return redactor

    def _setup(self, rules: RedactionRules, key: bytes | None) -> None:
        self._rules = rules
        self._version = rules.version
        self._paths = rules.paths
        self._card_ints = "card_number" in rules.detectors
        self._stand_ins = StandIns(rules.pseudonyms, key)
        self._scan: TextScan
        if self._version == 1:
            self._scan = PatternScan(rules.detectors, self._stand_ins)
        else:
            self._scan = ShapeScan(rules.detectors, self._stand_ins)

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
        return cls._of(RedactionRules.from_config(config, default_version=default_version))

    @classmethod
    def from_file(cls, path: Path) -> Redactor:
        """Build from a JSON file holding what :meth:`from_config` takes.

        Raises:
            RedactionConfigError: saying which file, and what is wrong with it.
        """
        return cls._of(RedactionRules.from_file(path))

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule name in force, sorted: what to record as the configuration used."""
        return self._rules.names

    @property
    def config(self) -> dict[str, Any]:
        """What :meth:`from_config` takes to build this same redactor again (the key
        aside; ``pseudonyms`` only when there are any, so rules without them read as
        they always did; ``version`` past 1 only, so version 1 rules read as before)."""
        return self._rules.config

    @property
    def version(self) -> int:
        """The detector set in force (:data:`REDACTION_VERSION` for new runs)."""
        return self._rules.version

    @property
    def pseudonymous(self) -> bool:
        """Whether some rule gives pseudonyms (and the redactor then needs a key)."""
        return bool(self._rules.pseudonyms)

    def keyed(self, key: bytes) -> Redactor:
        """This redactor, its pseudonyms keyed by ``key`` (the tenant's pseudonym key).

        Raises:
            ValueError: the key is shorter than 32 bytes.
        """
        if len(key) < 32:
            raise ValueError("a pseudonym key needs at least 32 bytes")
        return Redactor._of(self._rules, key)

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
                return self._scan.scan(value, fired)
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
        return luhn(str(value)) if self._version == 1 else is_card_v2(str(value))

    def _credential_key(self, key: object) -> bool:
        if self._version == 1:
            return is_credential_key(key)
        return isinstance(key, str) and is_secret_name(key)

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
        scrubbed = self._scan.scan(key, fired)
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

    def _string(self, value: str, fired: set[str], depth: int, level: int) -> str:
        """A string (version 2): JSON inside it parsed and scanned, else scanned as text;
        a string longer than :data:`SCAN_CAP` is scanned as text, window by window."""
        if len(value) > SCAN_CAP:
            return "".join(self._scan.scan(window, fired) for window in windows(value))
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
                    return self._scan.scan(value, fired)
                if not inner:
                    return value
                fired.update(inner)
                return json.dumps(scrubbed, ensure_ascii=False)
        return self._scan.scan(value, fired)


_JSON_DEPTH = 8
"""How deep JSON encoded inside strings is parsed and scanned; deeper, it is text."""
