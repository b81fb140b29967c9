"""The version 3 scan: version 3's detectors over a string and over what it encodes.

Like version 2 (:class:`~agent_blackbox.outbox._text_scan.ShapeScan`), matching runs on
the NFKC-normalised text with invisible characters removed (now variation selectors such
as U+FE0F and the Unicode tag characters too) and look-alike letters folded. Then:

- **``data:`` URLs.** A ``data:...;base64,`` body is decoded and scanned: as text when it
  is UTF-8, by every detector; otherwise (an image, a binary file) its printable runs of
  eight characters or more, by the credential detectors only (any 100 KB image holds
  something shaped like ``a@b.cd`` or a Luhn-valid number by chance, never a key by
  chance). When a rule fires inside, the whole body is replaced by that rule's
  placeholder: a body that hid a secret is not kept in any form (decoded and re-encoded,
  it would still hand back everything around the secret).
- **Percent-encoding.** The text is percent-decoded (twice, for ``%255F``) and the
  detectors run over that view too; what a match covers there is replaced in the text,
  so ``?api%5Fkey=...`` and ``email=alice%40example.com`` lose their values.
- **Line breaks inside a key.** The key shapes also run over the text with its line
  breaks taken out, before they run over the text itself (which would find the first
  line's part alone and leave the rest), so a key cut over lines goes whole; a plain
  word that starts the next line (``Thanks``) is not taken as the key's end.

Every detector runs on RE2 (:mod:`._shapes_v3`); the views' patterns are runs of one
character class or escape, and the few other checks run Python's engine over a bounded
slice or from a match's end to the next match's start, so the time stays linear in the
text.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._placeholders import CREDENTIAL, StandIns
from agent_blackbox.outbox._shapes import _KEY_HINTS, ALWAYS_ON_V2, Shape
from agent_blackbox.outbox._shapes_v3 import SHAPES_V3, matches
from agent_blackbox.outbox._text_views import (
    INVISIBLE_RUN,
    View,
    normalised,
    percent_decoded,
    without,
)
from agent_blackbox.outbox._text_views import folded as fold

_ROUNDS = 3
_SHORT = 256
_REMEMBERED_LENGTH = 16 * 1024
"""The longest text whose outcome a scan keeps (characters)."""
_REMEMBERED_CHARS = 1024 * 1024
"""The characters of texts and outcomes a scan keeps, at most (then all are forgotten at
once, and it begins again)."""
_DATA_DEPTH = 2
"""How deep ``data:`` URLs inside decoded ``data:`` URL bodies are decoded."""

_LINE_BREAKS = re.compile("([\r\n\x0b\x0c\x85\u2028\u2029]+)")
# The breaks taken out to join a key's lines: not one before a line that starts with a
# key's prefix (joined to the line before, it would read as the tail of its last word).
# The look-ahead is of a few characters: linear in Python's engine.
_JOINED_BREAKS = re.compile(
    "([\r\n\x0b\x0c\x85\u2028\u2029]+)(?!(?i:" + "|".join(map(re.escape, _KEY_HINTS)) + "))"
)
_DATA_URL = re2.compile(
    r"(?i)data:[^\s,;]{0,100}(?:;[^\s,;]{0,100}){0,8};base64,[A-Za-z0-9+/_-]+={0,2}"
)
_URL_SAFE = str.maketrans("-_", "+/")
_PRINTABLE_RUN = re2.compile(rb"[\x20-\x7e\t]{8,}")
_PLAIN_WORD = re.compile(r"[A-Za-z]+")
# What a credential's value runs over (the value class of credential_pair); one class
# repeated, matched from a given position: linear in Python's engine too.
_VALUE_RUN = re.compile(r"[^\s&#\"',;<>{}()\[\]]*")


def _decoded_body(body: str) -> tuple[str, bool] | None:
    """A ``data:`` URL's base64 body as text, and whether it was binary (then its
    printable runs, one a line); None when it is not base64."""
    stripped = body.translate(_URL_SAFE).rstrip("=")
    try:
        raw = base64.b64decode(stripped + "=" * (-len(stripped) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return "\n".join(run.decode("ascii") for run in _PRINTABLE_RUN.findall(raw)), True


Span = tuple[int, int, str]
"""Where to replace, and the label of the rule that fired."""


class DecodedScan:
    """The version 3 scan: the shapes ``names`` (of
    :data:`~agent_blackbox.outbox._shapes_v3.SHAPES_V3`) over the text normalised, over
    its percent-decoded view, inside its ``data:`` URLs, and (the key shapes) across its
    line breaks.

    Args:
        names: the shapes in force, in the order they run.
        stand_ins: what replaces a match.
    """

    __slots__ = (
        "_any_hint",
        "_credentials",
        "_keys",
        "_labels",
        "_scanned",
        "_scanned_chars",
        "_shapes",
        "_stand_ins",
    )

    def __init__(self, names: Iterable[str], stand_ins: StandIns) -> None:
        chosen = tuple(names)
        self._shapes: tuple[Shape, ...] = tuple(SHAPES_V3[n] for n in chosen)
        self._credentials = tuple(SHAPES_V3[n] for n in chosen if n in ALWAYS_ON_V2)
        self._keys = SHAPES_V3["api_key"] if "api_key" in chosen else None
        self._labels = tuple(dict.fromkeys(shape.label for shape in self._shapes))
        hints = {hint for shape in self._shapes for hint in shape.hints} | {"%", "base64,"}
        ordered = sorted(hints, key=len, reverse=True)
        self._any_hint = re.compile("|".join(map(re.escape, ordered)))
        self._stand_ins = stand_ins
        self._scanned: dict[str, tuple[str | None, frozenset[str]]] = {}
        self._scanned_chars = 0

    def scan(self, text: str, fired: set[str]) -> str:
        """``text`` with every version 3 detector applied. Unchanged when nothing fires;
        otherwise the normalised text, redacted.

        The scan is a function of the text alone (the stand-ins of these rules are
        fixed, or keyed pseudonyms), so its outcome is kept for the texts scanned
        lately: an agent hands the same texts over again and again (the model's answer
        comes back in the next request, a tool's result in the message that quotes it).
        """
        if len(text) > _REMEMBERED_LENGTH:
            return self._scan(text, fired, 0, self._shapes)
        scanned = self._scanned  # one dict operation at a time: safe between threads
        found = scanned.get(text)
        if found is None:
            own: set[str] = set()
            scrubbed = self._scan(text, own, 0, self._shapes)
            found = (None if scrubbed is text else scrubbed, frozenset(own))
            if self._scanned_chars > _REMEMBERED_CHARS:
                scanned.clear()
                self._scanned_chars = 0
            scanned[text] = found
            self._scanned_chars += len(text) + (0 if scrubbed is text else len(scrubbed))
        changed, labels = found
        if labels:
            fired.update(labels)
        return text if changed is None else changed

    def _scan(self, text: str, fired: set[str], depth: int, shapes: tuple[Shape, ...]) -> str:
        """``text`` with ``shapes`` applied (``depth``: how many ``data:`` URL bodies deep
        it was decoded from)."""
        normal = normalised(text)
        folded = fold(normal)
        lowered = folded.lower()
        if len(lowered) < _SHORT and self._any_hint.search(lowered) is None:
            return text
        hit = False
        if "base64," in lowered and depth < _DATA_DEPTH:
            spans = self._data_urls(folded, fired, depth)
            if spans:
                normal, folded = self._replaced(spans, normal, folded)
                hit = True
        # Keys across line breaks first (the text itself would give the first line's part
        # of such a key alone), then the text, then its percent-decoded view (after the
        # text: a value cut short by a decoded space, ``abc%20def``, is whole in the text).
        start = folded
        normal, folded = self._applied(self._across_breaks(folded), normal, folded, fired)
        normal, folded = self._in_text(normal, folded, shapes, fired)
        normal, folded = self._applied(self._decoded(folded, shapes), normal, folded, fired)
        return normal if hit or folded != start else text

    def _in_text(
        self, normal: str, folded: str, shapes: tuple[Shape, ...], fired: set[str]
    ) -> tuple[str, str]:
        """``normal`` and ``folded`` with what ``shapes`` find in ``folded`` replaced,
        shape after shape (each sees the placeholders of those before it, as in version
        2). A placeholder ends a word, so it may let a detector match next to it that could
        not before: rounds go on until one changes nothing (redacting twice is then
        redacting once), and at most _ROUNDS of them, which keeps the work linear."""
        for _ in range(_ROUNDS):
            before = folded
            lowered = folded.lower()
            # Past a few hundred characters the shapes' hints are found in one pass
            # (_Hints); a shorter text is quicker searched hint by hint.
            held = _Hints(lowered) if len(lowered) > _SHORT else None
            for shape in shapes:
                if _holds(lowered, shape.hints) if held is None else held.any(shape):
                    found = [(start, end, shape.label) for start, end in shape.find(folded)]
                    normal, folded = self._applied(found, normal, folded, fired)
            if folded == before:
                break
        return normal, folded

    def _applied(
        self, spans: list[Span], normal: str, folded: str, fired: set[str]
    ) -> tuple[str, str]:
        """``normal`` and ``folded`` with ``spans`` replaced; their labels added to
        ``fired``."""
        if not spans:
            return normal, folded
        fired.update(label for _, _, label in spans)
        return self._replaced(spans, normal, folded)

    def _data_urls(self, folded: str, fired: set[str], depth: int) -> list[Span]:
        """The bodies of ``data:`` URLs in which some rule fires, each with the label of
        the first such rule."""
        spans: list[Span] = []
        for url_start, end in matches(_DATA_URL, folded):
            start = url_start + folded[url_start:end].lower().rindex("base64,") + len("base64,")
            decoded = _decoded_body(folded[start:end])
            if decoded is None:
                continue
            body, binary = decoded
            inside: set[str] = set()
            self._scan(body, inside, depth + 1, self._credentials if binary else self._shapes)
            if inside:
                fired.update(inside)
                label = next((lb for lb in self._labels if lb in inside), sorted(inside)[0])
                spans.append((start, end, label))
        return spans

    def _decoded(self, folded: str, shapes: tuple[Shape, ...]) -> list[Span]:
        """What ``shapes`` find in the percent-decoded view of ``folded``, as spans of
        ``folded``; a credential's value runs on in ``folded`` as far as a value does
        (``%20def`` after a decoded ``abc``)."""
        decoded = percent_decoded(folded)
        if decoded is None:
            return []
        if not decoded.text.isascii():  # escapes of invisible characters
            decoded = without(decoded, INVISIBLE_RUN) or decoded
        spans = _merged(_found(decoded, shapes), ordered=False)
        if not spans:
            return []
        # Each value runs on at most to the next span: the runs add up to the text once.
        bounds = [start for start, _, _ in spans[1:]] + [len(folded)]
        return [
            (start, _value_end(folded, end, bound) if label == CREDENTIAL else end, label)
            for (start, end, label), bound in zip(spans, bounds, strict=True)
        ]

    def _across_breaks(self, folded: str) -> list[Span]:
        """The keys (of the key shapes, when in force) that ``folded`` holds cut by line
        breaks, each ending where :func:`_key_end` says."""
        keys = self._keys
        if keys is None or not _has_line_break(folded):
            return []
        if not _holds(folded.lower(), keys.hints):
            return []
        joined = without(folded, _JOINED_BREAKS)
        if joined is None:
            return []
        spans = [_key_end(folded, *span) for span in _found(joined, (keys,))]
        return [span for span in spans if _crosses_break(folded, span)]

    def _replaced(self, spans: list[Span], normal: str, folded: str) -> tuple[str, str]:
        """``normal`` and ``folded`` with each span replaced by its label's stand-in."""
        normal_parts: list[str] = []
        folded_parts: list[str] = []
        last = 0
        placeholders: dict[str, str] = {}  # a label's placeholder, when it is no pseudonym
        for start, end, label in spans:
            stand_in = placeholders.get(label)
            if stand_in is None:
                stand_in = self._stand_ins.of(label, normal[start:end])
                if not self._stand_ins.pseudonymous(label):
                    placeholders[label] = stand_in
            normal_parts += (normal[last:start], stand_in)
            folded_parts += (folded[last:start], stand_in)
            last = end
        return "".join((*normal_parts, normal[last:])), "".join((*folded_parts, folded[last:]))


def _found(view: View, shapes: Iterable[Shape]) -> list[Span]:
    """The spans (of the scanned text) of what ``shapes`` find in ``view``."""
    lowered = view.text.lower()
    held = _Hints(lowered) if len(lowered) > _SHORT else None
    spans: list[Span] = []
    for shape in shapes:
        if _holds(lowered, shape.hints) if held is None else held.any(shape):
            label = shape.label
            spans += [(s, e, label) for s, e in view.origins(shape.find(view.text))]
    return spans


def _key_end(folded: str, start: int, end: int, label: str) -> Span:
    """A key found across line breaks, ending before the last break it crosses when the
    line after it starts with a plain word (prose, not the key's rest)."""
    last = max(folded.rfind("\n", start, end), folded.rfind("\r", start, end))
    if last > start and _PLAIN_WORD.fullmatch(folded, last + 1, end) is not None:
        tail = folded[last + 1 : end]
        if tail.islower() or tail.istitle() or tail.isupper():
            end = last
            while end > start and folded[end - 1] in "\r\n":
                end -= 1
    return start, end, label


def _value_end(folded: str, end: int, bound: int) -> int:
    """Where a credential's value that reaches ``end`` ends in ``folded`` (by ``bound``)."""
    run = _VALUE_RUN.match(folded, end, bound)
    return end if run is None else run.end()


def _crosses_break(folded: str, span: Span) -> bool:
    """Whether a span holds a line break (a key on one line is the text's to find)."""
    return folded.find("\n", span[0], span[1]) >= 0 or folded.find("\r", span[0], span[1]) >= 0


def _merged(spans: list[Span], *, ordered: bool) -> list[Span]:
    """``spans`` in order (sorted first unless ``ordered``), each overlapping run of
    them merged into one (the first's label)."""
    merged: list[Span] = []
    for start, end, label in spans if ordered else sorted(spans):
        if merged and start < merged[-1][1]:
            first_start, first_end, first_label = merged[-1]
            merged[-1] = (first_start, max(first_end, end), first_label)
        else:
            merged.append((start, end, label))
    return merged


class _Hints:
    """Which shapes' hints a text holds, found in one pass over its UTF-8 by an RE2 set
    of one pattern a shape (any of its hints). A search for each hint passed over the
    whole text when the hint was absent, and most are absent from most texts (a crafted
    one holds none of them). A hint is in the text exactly when its UTF-8 is in the
    text's."""

    __slots__ = ("_held", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        found = _HINT_SET.Match(text.encode("utf-8", "surrogatepass"))
        self._held = frozenset(found or ())

    def any(self, shape: Shape) -> bool:
        """Whether the text holds one of ``shape``'s hints."""
        index = _HINT_INDEX.get(id(shape))
        if index is None:  # a shape outside the set: its hints looked for one by one
            return _holds(self._text, shape.hints)
        return index in self._held


def _hint_set(shapes: Iterable[Shape]) -> tuple[Any, dict[int, int]]:
    """An RE2 set matching any hint of each of ``shapes`` (one pattern a shape, over
    UTF-8), and each shape's index in it."""
    found = re2.Set.SearchSet()
    index: dict[int, int] = {}
    for shape in shapes:
        index[id(shape)] = found.Add(b"|".join(re2.escape(h).encode("utf-8") for h in shape.hints))
    found.Compile()
    return found, index


_HINT_SET, _HINT_INDEX = _hint_set(SHAPES_V3.values())


def _has_line_break(text: str) -> bool:
    """Whether ``text`` holds one of :data:`_LINE_BREAKS`' characters (an ASCII text can
    hold four of them, each found by the string's own search, faster than a pattern)."""
    if text.isascii():
        return "\n" in text or "\r" in text or "\x0b" in text or "\x0c" in text
    return _LINE_BREAKS.search(text) is not None


def _holds(text: str, hints: tuple[str, ...]) -> bool:
    # A plain loop: any() over a generator costs more than the searches themselves.
    for hint in hints:  # noqa: SIM110
        if hint in text:
            return True
    return False
