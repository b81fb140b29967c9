"""Walking values: a redacted deep copy of a JSON value, rule by rule.

The walk owns what a value's structure decides: a mapping key that names a credential
loses its value, and so does a header given as a name and a value; a configured path
loses its whole value; an integer that is a card number becomes a string stand-in;
strings go to the text scan (version 2 first parses JSON found inside them, version 3
JSON strings holding JSON too). From version 3 on, a number is a card number only where
a card is expected (under a card-like key, or in a mapping with a ``cvc`` or an
``exp_month``): an id or an order number passes the issuer and Luhn checks too often to
be redacted on its digits alone. Lists and
mappings are walked at most :data:`~agent_blackbox.schemas.MAX_VALUE_DEPTH` deep, so no
value can exhaust the stack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from agent_blackbox.outbox._detectors import is_credential_key, luhn
from agent_blackbox.outbox._placeholders import CREDENTIAL, StandIns, placeholder
from agent_blackbox.outbox._redaction_rules import PathRules
from agent_blackbox.outbox._shapes import is_card_v2, is_secret_name
from agent_blackbox.outbox._shapes_v3 import (
    holds_card_fields,
    is_card_field,
    is_card_value,
    is_secret_name_v3,
)
from agent_blackbox.outbox._text_scan import SCAN_CAP, TextScan, windows
from agent_blackbox.schemas import MAX_VALUE_DEPTH, canonical_text, deepest_path, too_deep


class _TooDeep(Exception):
    """Raised inside a walk that went past :data:`MAX_VALUE_DEPTH`; :meth:`ValueWalk.copy`
    turns it into ``NotSerialisable`` naming the path (the walk keeps no paths)."""


# The shortest string any detector can match is an e-mail like "a@b.io".
_MIN_LENGTH = 6
_CARD_INTS = range(10**12, 10**19)
_CREDENTIAL_PLACEHOLDER = placeholder(CREDENTIAL)
_INERT_SCALARS = frozenset({bool, float, type(None)})
_PATH_PLACEHOLDER = placeholder("path")

_JSON_DEPTH = 8
"""How deep JSON encoded inside strings is parsed and scanned; deeper, it is text."""
_JSON_HEADS_V2 = ("{", "[")
_JSON_HEADS = ("{", "[", '"')
"""How a string holding JSON starts (version 3: a JSON string too, JSON encoded twice)."""

_PLANNED_KEYS = 64
"""Mappings of at most this many keys keep their plan (:meth:`ValueWalk._plan`)."""
_PLANNED_CHARS = 1024
"""... and whose keys hold at most this many characters in all (what the plans keep
alive stays small)."""
_PLANS = 4096
"""Plans kept at most (then all are forgotten at once)."""


def _key_chars(value: dict[Any, Any]) -> int:
    return sum(len(key) for key in value if isinstance(key, str))


@dataclass(frozen=True, slots=True)
class _KeyPlan:
    """What a mapping's keys decide, in their order: each key's scanned form (None when
    the scan left it as it is), whether it names a credential, and whether a card number
    is expected under it; the rules the keys' scans fired; and whether it has both a
    ``name`` and a ``value`` (a header given as a name and a value)."""

    keys: tuple[tuple[Any, bool, bool], ...]
    fired: frozenset[str]
    named: bool


_Live: TypeAlias = PathRules
"""Path rules still in play at a node: each rule's name and its segments left to match."""


def _advance(live: _Live, key: object) -> tuple[_Live, list[str]]:
    """The rules still in play below ``key``, and the names of those that end there."""
    below = tuple((name, rest[1:]) for name, rest in live if rest[0] in ("*", key))
    return tuple(rule for rule in below if rule[1]), [name for name, rest in below if not rest]


class ValueWalk:
    """Copies JSON values with the rules applied, adding the names of those that fired
    to a set the caller owns.

    Args:
        version: the detector set, which decides how keys and strings are judged.
        paths: the path rules, whose whole values are replaced.
        scan: the text scan of ``version``, which redacts each string.
        stand_ins: what replaces a path's value or a card number.
        card_ints: whether integers that are card numbers are redacted.
    """

    __slots__ = ("_card_ints", "_paths", "_plans", "_scan", "_stand_ins", "_version")

    def __init__(
        self,
        *,
        version: int,
        paths: PathRules,
        scan: TextScan,
        stand_ins: StandIns,
        card_ints: bool,
    ) -> None:
        self._version = version
        self._paths = paths
        self._scan = scan
        self._stand_ins = stand_ins
        self._card_ints = card_ints
        self._plans: dict[tuple[Any, ...], _KeyPlan] = {}
        """How the keys of mappings seen lately are treated (:meth:`_plan`), by their
        keys in order (after whether a card is expected)."""

    def inert(self, value: Any, depth: int = 0) -> bool:
        """Whether no rule can fire anywhere in ``value``, checked far faster than
        :meth:`copy` runs: scalars, strings too short for any detector, and lists of
        them, when no path rule is configured. Mappings always go through :meth:`copy`
        (their keys may be credentials)."""
        if self._paths:
            return False
        kind = type(value)
        if kind is str:
            return len(value) < _MIN_LENGTH  # shorter than any credential name, too
        if kind is int:
            return self._version > 2 or not (self._card_ints and value in _CARD_INTS)
        if self._version > 1 and kind is not list and kind is not tuple:
            return kind in _INERT_SCALARS
        if kind in _INERT_SCALARS:
            return True
        if kind is list or kind is tuple:
            if depth >= MAX_VALUE_DEPTH:
                return False  # copy() names where it is too deep
            for item in value:  # noqa: SIM110 -- a loop: all() over a generator costs more
                if not self.inert(item, depth + 1):
                    return False
            return True
        return False

    def copy(self, value: Any, *, path: str, fired: set[str]) -> Any:
        """A redacted deep copy of ``value`` (tuples become lists); never mutates it.

        Raises:
            NotSerialisable: lists and mappings in ``value`` nest deeper than
                :data:`~agent_blackbox.schemas.MAX_VALUE_DEPTH` (naming where, from
                ``path``, the value's own name).
        """
        try:
            return self._walk(value, self._paths, fired, 0, 0)
        except _TooDeep:
            raise too_deep(deepest_path(value, path=path) or path) from None

    def apart(self, value: dict[Any, Any], turns: str | None) -> bool:
        """Whether :meth:`copy` of the mapping ``value`` copies each of its values alone,
        as :meth:`copy_part` does at level 1, under the same key, and (with ``turns``)
        each item of the list under that key alone, as :meth:`copy_part` does at level
        2: no path rule is configured, and no key names a credential or a card, changes
        when scanned, or makes the mapping a header or a card's details, and the list
        of turns is no header."""
        if self._paths or (self._credential_key(value.get("name")) and "value" in value):
            return False
        cards = self._card_ints and self._version > 2
        if cards and holds_card_fields(value):
            return False
        for key in value:
            if type(key) is not str or self._credential_key(key):
                return False
            if (cards and is_card_field(key)) or (
                self._version > 1 and len(key) >= _MIN_LENGTH and self._scans(key)
            ):
                return False
        items = None if turns is None else value.get(turns)
        if turns is not None and type(items) is not list:
            return False
        return not (items and len(items) == 2 and self._credential_key(items[0]))

    def _scans(self, key: str) -> bool:
        """Whether scanning ``key`` fires a rule or changes it."""
        fired: set[str] = set()
        return self._scan.scan(key, fired) != key or bool(fired)

    def copy_part(self, value: Any, *, level: int, fired: set[str]) -> Any:
        """A redacted copy of ``value`` as :meth:`copy` copies it at ``level`` below the
        root of a mapping :meth:`apart` holds for: a value of the mapping (1), an item
        of its list of turns (2).

        Raises:
            NotSerialisable: it nests too deeply (naming no path: :meth:`copy` of the
                whole value names where).
        """
        try:
            return self._walk(value, (), fired, 0, level)
        except _TooDeep:
            raise too_deep("$") from None

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
        # From version 3 on, a number alone is never a card: only where one is expected.
        if self._version > 2:
            return False
        return luhn(str(value)) if self._version == 1 else is_card_v2(str(value))

    def _credential_key(self, key: object) -> bool:
        if self._version == 1:
            return is_credential_key(key)
        if self._version == 2:
            return isinstance(key, str) and is_secret_name(key)
        return isinstance(key, str) and is_secret_name_v3(key)

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
        self,
        value: dict[Any, Any],
        live: _Live,
        fired: set[str],
        depth: int,
        level: int,
        *,
        cards: bool = False,
    ) -> dict[Any, Any]:
        kept = (cards, *value) if len(value) <= _PLANNED_KEYS else None
        plan = None if kept is None else self._plans.get(kept)
        if plan is None:
            plan = self._plan(value, cards, kept)
        if plan.fired:
            fired.update(plan.fired)
        # A header as {"name": "Authorization", "value": "..."} hides its secret in "value".
        secret_value = plan.named and self._credential_key(value["name"])
        out: dict[Any, Any] = {}
        for (key, item), (scanned, credential, card) in zip(value.items(), plan.keys, strict=True):
            if scanned is not None:
                key = scanned
            if credential or (secret_value and key == "value"):
                fired.add(CREDENTIAL)
                out[key] = _CREDENTIAL_PLACEHOLDER
            elif card:
                out[key] = self._card_child(key, item, live, fired, depth, level)
            else:
                out[key] = self._child(key, item, live, fired, depth, level)
        return out

    def _plan(self, value: dict[Any, Any], cards: bool, kept: tuple[Any, ...] | None) -> _KeyPlan:
        """How :meth:`_mapping` treats the keys of ``value``, in order: all of it is
        decided by the keys alone (and ``cards``), so it is kept under ``kept`` (``cards``
        and the keys), unless that is None or the keys are long."""
        # A language model's log-probabilities: {"token": "Hello", "logprob": -0.1}.
        text_token = self._version > 1 and "logprob" in value
        # Version 3: where a card number is expected (cards: the mapping is under a
        # card-like key), and the card detector is on.
        expects = self._card_ints and self._version > 2
        all_cards = expects and (cards or holds_card_fields(value))
        fired: set[str] = set()
        seen: dict[Any, None] = {}
        keys: list[tuple[Any, bool, bool]] = []
        for key in value:
            credential = self._credential_key(key) and not (text_token and key == "token")
            card = expects and (all_cards or is_card_field(key))
            scanned = key
            if self._version > 1 and isinstance(key, str) and len(key) >= _MIN_LENGTH:
                scanned = self._key_of(key, seen, fired)
            seen[scanned] = None
            keys.append((None if scanned is key else scanned, credential, card))
        plan = _KeyPlan(tuple(keys), frozenset(fired), "name" in value and "value" in value)
        if kept is not None and _key_chars(value) <= _PLANNED_CHARS:
            plans = self._plans
            if len(plans) >= _PLANS:
                plans.clear()
            plans[kept] = plan
        return plan

    def _card_child(
        self, key: object, item: Any, live: _Live, fired: set[str], depth: int, level: int
    ) -> Any:
        """An item where a card number is expected (version 3): a card number (digits,
        grouped or not, or a number) goes whole; a list's and a mapping's items are
        expected to be card numbers in turn; a path rule ending here applies first."""
        if live and _advance(live, key)[1]:
            return self._child(key, item, live, fired, depth, level)
        if is_card_value(item):
            fired.add("card_number")
            text = str(int(item)) if type(item) is float else str(item)
            return self._stand_ins.of("card_number", text)
        if isinstance(item, dict | list) and not live:
            if level >= MAX_VALUE_DEPTH:
                raise _TooDeep
            if isinstance(item, list):  # {"cards": [4111..., ...]}
                return [self._card_child(key, x, live, fired, depth, level + 1) for x in item]
            return self._mapping(item, live, fired, depth, level + 1, cards=True)
        return self._child(key, item, live, fired, depth, level)

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
        heads = _JSON_HEADS if self._version > 2 else _JSON_HEADS_V2
        if head in heads and depth < _JSON_DEPTH:
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                parsed = None
            if isinstance(parsed, str):  # version 3: JSON encoded again, as a JSON string
                inner_text: set[str] = set()
                scrubbed_text = self._string(parsed, inner_text, depth + 1, level)
                if not inner_text:
                    return value
                fired.update(inner_text)
                return json.dumps(scrubbed_text, ensure_ascii=False)
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
