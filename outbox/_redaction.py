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

The :class:`Redactor` composes the parts, each in a module of its own: the rules, checked
(:mod:`._redaction_rules`); the detectors of each version (:mod:`._detectors`,
:mod:`._shapes`, :mod:`._shapes_v3`); matching them in text (:mod:`._text_scan`,
:mod:`._decoded_scan` over the views of :mod:`._text_views`); walking a value
(:mod:`._value_walk`); and what stands in for a removed value (:mod:`._placeholders`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_blackbox.outbox._decoded_scan import DecodedScan
from agent_blackbox.outbox._detectors import (
    ALWAYS_ON,
    CREDENTIAL_KEYS,
    DEFAULT_DETECTORS,
    DETECTORS,
    Detector,
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
    RedactionRules,
)
from agent_blackbox.outbox._shapes import (
    ALWAYS_ON_V2,
    SHAPES,
    Finder,
    Shape,
)
from agent_blackbox.outbox._text_scan import (
    OVERSIZE,
    SCAN_CAP,
    PatternScan,
    ShapeScan,
    TextScan,
)
from agent_blackbox.outbox._value_walk import ValueWalk

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

    __slots__ = ("_rules", "_walk")

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
        """A redactor of rules already checked (``__init__`` would check them again)."""
        redactor = cls.__new__(cls)
        redactor._setup(rules, key)
        return redactor

    def _setup(self, rules: RedactionRules, key: bytes | None) -> None:
        """Compose the parts that apply ``rules``, pseudonyms keyed by ``key``."""
        self._rules = rules
        stand_ins = StandIns(rules.pseudonyms, key)
        scan: TextScan
        if rules.version == 1:
            scan = PatternScan(rules.detectors, stand_ins)
        elif rules.version == 2:
            scan = ShapeScan(rules.detectors, stand_ins)
        else:
            scan = DecodedScan(rules.detectors, stand_ins)
        self._walk = ValueWalk(
            version=rules.version,
            paths=rules.paths,
            scan=scan,
            stand_ins=stand_ins,
            card_ints="card_number" in rules.detectors,
        )

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
        return self._walk.inert(value, depth)

    def apart(self, value: dict[Any, Any], turns: str | None) -> bool:
        """Whether redacting the mapping ``value`` redacts each of its values alone
        (:meth:`redact_part`, level 1), and each item of its list under ``turns`` alone
        (level 2): so a value seen before may keep its redacted copy. See
        :meth:`~agent_blackbox.outbox._value_walk.ValueWalk.apart`."""
        return self._walk.apart(value, turns)

    def redact_part(self, value: Any, *, level: int) -> Redacted:
        """A value of a mapping :meth:`apart` holds for (``level`` 1), or an item of its
        list of turns (2), redacted as :meth:`redact` of the mapping redacts it.

        Raises:
            NotSerialisable: it nests too deeply.
        """
        fired: set[str] = set()
        redacted = self._walk.copy_part(value, level=level, fired=fired)
        return Redacted(redacted, tuple(sorted(fired)))

    def redact(self, value: Any, *, path: str = "$") -> Redacted:
        """Return a redacted deep copy of ``value`` (tuples become lists); never mutates it.

        Raises:
            NotSerialisable: lists and mappings in ``value`` nest deeper than
                :data:`~agent_blackbox.schemas.MAX_VALUE_DEPTH` (naming where, from
                ``path``, the value's own name).
        """
        fired: set[str] = set()
        redacted = self._walk.copy(value, path=path, fired=fired)
        return Redacted(redacted, tuple(sorted(fired)))
