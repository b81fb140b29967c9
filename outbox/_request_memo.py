"""What a run's LLM requests already cost, kept for the requests after them.

An agent sends its whole conversation with every call, so request ``n`` repeats the
messages of requests ``1..n-1``. Redacting, writing canonical JSON and digesting the
whole request at every call made recording an LLM call cost in proportion to the
conversation's length. A :class:`RequestMemo` (one per run, in record mode and in
replay alike) keeps, for each top-level field of a request and each item of its list of
turns, the redacted copy, the rules that fired and its canonical texts, keyed by the
exact bytes of the part as the agent handed it over (``marshal`` version 2: key order
kept, an int told from a float, floats by their bits). A part seen before is not walked again; the
request's texts are put together from its parts' texts (:func:`object_text`), and its
digests taken over those bytes.

Only where that changes nothing: the redaction rules redact each part alone
(:meth:`Scrub.apart`: no path rule, no credential, card or header context above the
parts), and every part is built of plain JSON types. Otherwise, or when a part cannot be
recorded (too deep, a lone surrogate), the request goes the whole way as before, which
also raises the error naming where. A property test compares both ways byte for byte.

The redacted copies are the recorder's own objects, never handed to the agent and never
changed, so later steps of the same call (the body's request text, the request stored
by reference) find the parts of a request by the identity of its fields' values.

Replay knows more than record mode: the request it is about to compare was recorded,
and when no rule fired on that call (its envelope has no ``redacted`` attribute) the
recorded request is the one the agent handed over, unchanged. So a replayed request's
new parts are first taken as they are, without the walk (:class:`Expected`). When the
request so digested matches the recorded digest, it is the recorded request, which
redaction left alone, and so would have left each of its parts; when it does not, the
parts taken that way are forgotten and the request is scrubbed the whole way, as in
record mode, before the divergence is reported from it.

When a rule did fire on the call, it most often fired on a turn of the conversation's
beginning, which the memo holds scrubbed since the call that sent it first; the new
turns are still taken as they are, except a part whose text holds what a stand-in opens
with (``[redacted:``, ``[email:``...), which is scrubbed. The same follows from a
match: a taken part's text is then the recorded part's, which holds no stand-in, so no
rule fired on it when it was recorded, and redaction (a pure function of the value and
the run's rules) leaves it as it is now.
"""

from __future__ import annotations

import json
import marshal
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_blackbox.outbox._errors import BlackboxError
from agent_blackbox.outbox._llm import llm_input
from agent_blackbox.outbox._placeholders import may_hold_stand_in
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.schemas import (
    CANONICAL_V1,
    Canonicalisation,
    Digester,
    EventType,
    RunningDigest,
    SplitRequest,
    object_text,
    plain_ordered_text,
)
from agent_blackbox.schemas._request_prefix import turn_key

_MARK = "\x00"
"""Where a request's text goes in what is digested (see ``RequestParts.digest``)."""

KEPT_CALLS = 8
"""A part not repeated by any of this many requests since is forgotten."""
_RECENT = 4
"""Requests whose parts later steps may still ask for (concurrent calls of one run)."""


@dataclass(slots=True)
class _Part:
    """One field of a request, or one item of its list of turns, as recorded."""

    value: Any
    """The redacted copy."""
    fired: tuple[str, ...]
    texts: dict[str, str]
    """The value's canonical JSON by canonicalisation name."""
    used: int

    def text(self, canonical: Canonicalisation) -> str:
        found = self.texts.get(canonical.name)
        if found is None:
            found = self.texts[canonical.name] = canonical.json(self.value).decode("utf-8")
        return found


@dataclass(frozen=True, slots=True)
class _Fed:
    """A digest fed a request's text up to the end of its last item of turns."""

    opening: str
    """What it was fed before the first item (the list's ``[`` included)."""
    running: RunningDigest
    items: int


@dataclass(slots=True)
class _TurnTexts:
    """The canonical JSON of a request's list of turns, by canonicalisation name; and,
    when the list goes on from the whole list of the run's request before it, that
    list's texts, so that only the new items' texts are joined."""

    texts: dict[str, str] = field(default_factory=dict)
    earlier: dict[str, str] | None = None
    """The texts of the list this one goes on from (all of it: this list's first
    ``shared`` items); that list's own ``texts``, so never a chain of requests."""
    shared: int = 0
    fed: dict[tuple[str, str], _Fed] = field(default_factory=dict)
    """The digests of the request fed through its last item, by canonicalisation and
    what the digested text holds before the request (``RequestParts.digest``)."""
    earlier_fed: dict[tuple[str, str], _Fed] | None = None
    """The ``fed`` of the list this one goes on from, as ``earlier``."""

    def text(self, items: list[_Part], canonical: Canonicalisation) -> str:
        found = self.texts.get(canonical.name)
        if found is None:
            before = None if self.earlier is None else self.earlier.get(canonical.name)
            if before is None:
                found = "[" + ",".join(p.text(canonical) for p in items) + "]"
            elif len(items) == self.shared:
                found = before
            else:
                tail = ",".join(p.text(canonical) for p in items[self.shared :])
                found = before[:-1] + "," + tail + "]"
            self.texts[canonical.name] = found
        return found


@dataclass(slots=True)
class RequestParts:
    """A redacted request, and the parts it is made of."""

    value: dict[str, Any]
    """The redacted request (its list of turns a list of the parts' values)."""
    fields: dict[str, _Part]
    """Each top-level field but the list of turns, in the request's order."""
    key: str | None
    items: list[_Part]
    fired: frozenset[str]
    turns: _TurnTexts
    wholes: dict[str, str] = field(default_factory=dict)

    def text(self, canonical: Canonicalisation) -> str:
        """The request's canonical JSON under ``canonical``, from its parts' texts."""
        found = self.wholes.get(canonical.name)
        if found is None:
            members = {name: part.text(canonical) for name, part in self.fields.items()}
            if self.key is not None:
                members[self.key] = self.turns.text(self.items, canonical)
            found = object_text(members, code_point_keys=canonical.code_point_keys)
            self.wholes[canonical.name] = found
        return found

    def sha256(self, canonical: Canonicalisation) -> str:
        """SHA-256 of the request's canonical JSON under ``canonical``."""
        return self.digest(canonical, CANONICAL_V1.digest)

    def digest(
        self, canonical: Canonicalisation, digester: Digester, *, within: str = _MARK
    ) -> str:
        """``digester``'s digest of the request's canonical JSON under ``canonical``,
        or of ``within`` with the request's text in place of its one NUL (which no
        canonical JSON holds: it is written escaped).

        The text is never put together: the digest is fed it piece by piece, and when
        the request goes on from the whole of the run's request before it, from a copy
        of that request's digest fed through its last item, so only the new items are
        fed (a digest follows the conversation's new turns, not its length).
        """
        key = self.key
        if key is None:
            whole = within.replace(_MARK, self.text(canonical))
            return digester.of_canonical(whole.encode("utf-8"))
        members = {name: part.text(canonical) for name, part in self.fields.items()}
        members[key] = _MARK
        opening, closing = within.split(_MARK)
        before, after = object_text(members, code_point_keys=canonical.code_point_keys).split(_MARK)
        opening += before + "["
        slot = (canonical.name, within)
        turns, items = self.turns, self.items
        earlier = None if turns.earlier_fed is None else turns.earlier_fed.get(slot)
        if earlier is not None and earlier.opening == opening and earlier.items == turns.shared:
            running, done = earlier.running.copy(), earlier.items
        else:
            running, done = digester.begin(), 0
            running.update(opening.encode("utf-8"))
        if done < len(items):
            tail = ",".join(part.text(canonical) for part in items[done:])
            running.update((("," if done else "") + tail).encode("utf-8"))
        turns.fed[slot] = _Fed(opening, running.copy(), len(items))
        running.update(("]" + after + closing).encode("utf-8"))
        return digester.finished(running)

    def split(self) -> SplitRequest:
        """The request as the version 1 texts of its parts (a new object: prefix
        matching swaps its texts for earlier ones)."""
        fields = {name: part.text(CANONICAL_V1) for name, part in self.fields.items()}
        v1 = CANONICAL_V1.name  # every part's version 1 text is written when it is made
        return SplitRequest(fields, self.key, [p.texts[v1] for p in self.items])

    def holds(self, request: Mapping[str, Any]) -> bool:
        """Whether ``request`` is this request or a copy of it holding the same objects."""
        value = self.value
        if request is value:
            return True
        if len(request) != len(value):
            return False
        for (name, item), (theirs, other) in zip(value.items(), request.items(), strict=True):
            if name != theirs or item is not other:
                return False
        return True


@dataclass(frozen=True, slots=True)
class Expected:
    """What replay knows of the recorded event the code's next crossing is compared
    with. When no redaction rule fired on it, the crossing's input (and output) as the
    code hands it over is what was recorded, or the crossing diverges. An LLM call
    takes its request's new parts as they are (see the module's docstring); the
    contract's other inputs are digested as given first (``Contract.tool``...)."""

    event_type: str
    digest: str
    """The event's recorded input digest."""
    output_digest: str
    """Its recorded output digest (a transition's: over the state it set)."""
    fired: bool = False
    """A redaction rule fired on the event: only an LLM call's request parts that hold
    no stand-in are taken as they are (see the module's docstring); other inputs are
    scrubbed the whole way."""


class _Taken(list[tuple[int, bytes]]):
    """The keys of the parts one call took as they were (see :class:`Expected`).

    Args:
        fired: a rule fired on the recorded call: a part that may hold a stand-in is
            scrubbed rather than taken.
    """

    __slots__ = ("fired",)

    def __init__(self, *, fired: bool) -> None:
        super().__init__()
        self.fired = fired


@dataclass(frozen=True, slots=True)
class Asked:
    """An LLM call's request as the memo scrubbed and digested it."""

    input: dict[str, Any]
    digest: str
    parts: RequestParts


class RequestMemo:
    """The parts of one run's latest LLM requests (see the module's docstring).

    Args:
        scrub: the run's redaction rules.
        digest: the run's digest (its canonicalisation is the run's).
    """

    def __init__(self, scrub: Scrub, digest: Digester) -> None:
        self._scrub = scrub
        self._digest = digest
        self._parts: dict[tuple[int, bytes], _Part] = {}
        self._calls = 0
        self._recent: deque[RequestParts] = deque(maxlen=_RECENT)
        self._latest: _LatestTurns | None = None
        self._lock = threading.Lock()
        self.expected: Callable[[], Expected | None] | None = None
        """Replay's: what it knows of the recorded event the next call is compared with
        (None in record mode; set with ``Contract.expected``)."""

    def asked(self, provider: str, model: str, request: dict[str, Any]) -> Asked | None:
        """The scrubbed input of an LLM call of ``request`` (the caller's copy, which is
        not kept) and its digest, from the parts already seen; None where the memo
        does not apply (then scrub and digest the whole request)."""
        key = turn_key(request)
        if not self._scrub.apart(request, key):
            return None
        expected = None if self.expected is None else self.expected()
        if expected is not None and expected.event_type != EventType.LLM_CALL:
            expected = None
        taken = None if expected is None else _Taken(fired=expected.fired)
        with self._lock:
            latest = self._latest
        try:
            parts, digest = self._digested(provider, model, request, key, taken)
            if expected is not None and taken and digest != expected.digest:
                self._forget_taken(taken, latest)
                parts, digest = self._digested(provider, model, request, key, None)
        except (BlackboxError, ValueError):
            if taken:
                self._forget_taken(taken, latest)
            return None  # the whole way raises it again, naming where
        with self._lock:
            self._recent.append(parts)
        return Asked(llm_input(provider, model, parts.value), digest, parts)

    def _digested(
        self,
        provider: str,
        model: str,
        request: dict[str, Any],
        key: str | None,
        taken: _Taken | None,
    ) -> tuple[RequestParts, str]:
        """The request's parts (new ones taken as they are when given ``taken``) and its
        input digest."""
        parts = self._request(request, key, taken)
        canonical = self._digest.canonical
        members = {
            "provider": canonical.json(provider).decode("utf-8"),
            "model": canonical.json(model).decode("utf-8"),
            "request": _MARK,
        }
        within = object_text(members, code_point_keys=canonical.code_point_keys)
        return parts, parts.digest(canonical, self._digest, within=within)

    def _forget_taken(self, taken: _Taken, latest: _LatestTurns | None) -> None:
        """Forget the parts a call took as they were, and the list of turns they were
        found in (the request did not match its recorded digest, or was refused)."""
        with self._lock:
            for part_key in taken:
                self._parts.pop(part_key, None)
            self._latest = latest
        taken.clear()

    def parts_of(self, request: Any) -> RequestParts | None:
        """The parts of a request :meth:`asked` scrubbed (or a copy of it), if recent."""
        if not isinstance(request, Mapping):
            return None
        with self._lock:  # another thread of the run may be appending
            recent = tuple(self._recent)
        for parts in reversed(recent):
            if parts.holds(request):
                return parts
        return None

    def _request(
        self, request: dict[str, Any], key: str | None, taken: _Taken | None = None
    ) -> RequestParts:
        """The request's parts, each found or made (given ``taken``, the new ones taken as
        they are and noted there); forgets the parts not used lately.

        Raises:
            NotSerialisable: a part nests too deeply or has no JSON form.
            ValueError: a part is not plain JSON (:class:`_NotPlain`), or has a lone
                surrogate.
        """
        with self._lock:
            self._calls += 1
            now = self._calls
        fields = {
            name: self._part(value, 1, now, taken) for name, value in request.items() if name != key
        }
        items: list[_Part] = []
        turns = _TurnTexts()
        if key is not None:
            items, turns = self._turns(key, request[key], now, taken)
        value: dict[str, Any] = {}
        for name in request:
            value[name] = [p.value for p in items] if name == key else fields[name].value
        fired = frozenset(name for part in (*fields.values(), *items) for name in part.fired)
        if now % KEPT_CALLS == 0:
            self._forget(now)
        return RequestParts(value, fields, key, items, fired, turns)

    def _turns(
        self, key: str, turns: list[Any], now: int, taken: _Taken | None
    ) -> tuple[list[_Part], _TurnTexts]:
        """The parts of a request's list of turns, and the texts it is written from.

        A conversation's request is most often the run's request before it plus a few
        new turns: the items it begins with that equal the latest list's (see
        :meth:`_Held.shared`) are that list's parts, and only the items after
        them are looked up one by one.
        """
        if type(turns) is not list:  # a subclass: marshal refuses it, its items not
            return [self._part(item, 2, now, taken) for item in turns], _TurnTexts()
        with self._lock:
            latest = self._latest
        shared = 0 if latest is None or latest.key != key else latest.held.shared(turns)
        parts: list[_Part] = []
        held = _Held()
        if latest is not None and shared:
            parts = latest.parts[:shared]
            held = latest.held.prefix(shared)
            for part in parts:
                part.used = now
        for item in turns[shared:]:
            exact = marshal.dumps(item, 2)
            parts.append(self._found(item, exact, 2, now, taken))
            held.add(item, exact)
        texts = _TurnTexts()
        if latest is not None and 0 < shared == len(latest.parts):
            texts.earlier, texts.shared = latest.texts.texts, shared
            texts.earlier_fed = latest.texts.fed
        with self._lock:
            self._latest = _LatestTurns(key, held, parts, texts)
        return parts, texts

    def _part(self, value: Any, level: int, now: int, taken: _Taken | None = None) -> _Part:
        """The part ``value`` at ``level``, found by its exact bytes or made."""
        # marshal's version 2 writes plain types exactly (an int is no float, keys in
        # order, floats by their bits, no references between objects), refuses their
        # subclasses, and costs a fraction of writing JSON.
        return self._found(value, marshal.dumps(value, 2), level, now, taken)

    def _found(
        self, value: Any, exact: bytes, level: int, now: int, taken: _Taken | None = None
    ) -> _Part:
        """The part ``value`` whose marshal bytes are ``exact``, found or made: scrubbed,
        or, given ``taken``, copied as it is and its key noted there (see
        :class:`Expected`)."""
        found = self._parts.get((level, exact))
        if found is None:
            ordered = plain_ordered_text(value)
            if ordered is None:  # NaN, bytes, a set...
                raise _NotPlain
            if taken is not None and not (taken.fired and may_hold_stand_in(ordered)):
                # The walk's copy of a value no rule fires on: the same keys in the same
                # order, tuples as lists, every scalar as it is.
                found = _Part(json.loads(ordered), (), {}, now)
                taken.append((level, exact))
            else:
                redacted, fired = self._scrub.part(value, level=level)
                found = _Part(redacted, fired, {}, now)
            # Both texts now: a part that has none fails here, not in a later step. The
            # run's text is most often the same text (RFC 8785 writes most values so).
            canonical = self._digest.canonical
            v1 = found.text(CANONICAL_V1)
            found.texts[canonical.name] = canonical.json_beside(found.value, v1)
            self._parts[level, exact] = found
        found.used = now
        return found

    def _forget(self, now: int) -> None:
        with self._lock:
            self._parts = {k: p for k, p in self._parts.items() if p.used > now - KEPT_CALLS}


@dataclass(slots=True)
class _Held:
    """The items of a list of turns as the memo holds them, to tell whether a later
    list begins with them.

    Each item is held as a copy of its own: its dicts and lists copied, its strings and
    ``None`` the agent's own (immutable) objects. ``==`` compares a list of items with
    the copies in C, item by item (the same string objects equal at once). It is exact
    where a part's bytes are concerned for values built of exact dicts, lists, strings
    and ``None`` alone: no other value equals a string or ``None``, and an equal string,
    or a mapping equal to a dict, is written, redacted and digested alike. An item with
    any other value (a number: ``1 == 1.0 == True``; a tuple) is also held as the bytes
    marshal wrote it in, which it must be written in again.
    """

    copies: list[Any] = field(default_factory=list)
    exact: dict[int, bytes] = field(default_factory=dict)
    """The marshal bytes of each item held whose ``==`` is not exact, by position."""

    def add(self, item: Any, exact: bytes) -> None:
        copy, plain = _copied(item)
        if not plain:
            self.exact[len(self.copies)] = exact
        self.copies.append(copy)

    def prefix(self, count: int) -> _Held:
        """The first ``count`` items held (a new holder: the latest list is kept)."""
        exact = {at: written for at, written in self.exact.items() if at < count}
        return _Held(self.copies[:count], exact)

    def shared(self, turns: list[Any]) -> int:
        """How many of the items held ``turns`` begins with."""
        copies = self.copies
        count = len(copies)
        try:
            if len(turns) < count or turns[:count] != copies:
                count = next(
                    (
                        at
                        for at, pair in enumerate(zip(turns, copies, strict=False))
                        if pair[0] != pair[1]
                    ),
                    min(len(turns), count),
                )
        except Exception:  # an item whose == raises (an array): none is taken as held
            return 0
        for at in sorted(self.exact):
            if at >= count:
                break
            if marshal.dumps(turns[at], 2) != self.exact[at]:
                return at
        return count


def _copied(value: Any) -> tuple[Any, bool]:
    """``value`` with its dicts and lists copied, and whether it holds nothing but exact
    dicts, lists, strings and ``None``."""
    kind = type(value)
    if kind is str or value is None:
        return value, True
    if kind is dict:
        plain = True
        copy = {}
        for name, item in value.items():
            copy[name], alone = _copied(item)
            plain = plain and alone and type(name) is str
        return copy, plain
    if kind is list:
        items = [_copied(item) for item in value]
        return [copy for copy, _ in items], all(alone for _, alone in items)
    return value, False  # held by its bytes too: a container inside is checked there


@dataclass(frozen=True, slots=True)
class _LatestTurns:
    """The list of turns of the run's latest request."""

    key: str
    held: _Held
    parts: list[_Part]
    texts: _TurnTexts


class _NotPlain(ValueError):
    """A part of a request is not built of plain JSON types."""
