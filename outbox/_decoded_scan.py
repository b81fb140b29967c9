"""The version 3 scan: version 3's detectors over a string and over what it encodes.

Like version 2 (:class:`~agent_blackbox.outbox._text_scan.ShapeScan`), matching runs on
the NFKC-normalised text with invisible characters removed (now variation selectors such
as U+FE0F and the Unicode tag characters too) and look-alike letters folded. Then:

- **``data:`` URLs.** A ``data:...;base64,`` body is decoded and scanned (as UTF-8 text,
  or byte for byte when it is not UTF-8, which finds a key in a binary file). When a
  rule fires inside, the whole body is replaced by that rule's placeholder: a body that
  hid a secret once is not kept in any form (decoded and re-encoded, it would still hand
  back everything around the secret in a shape the reader cannot check by eye).
- **Percent-encoding.** The text is percent-decoded (twice, for ``%255F``) and the
  detectors run over that view too; what a match covers there is replaced in the text,
  so ``?api%5Fkey=...`` and ``email=alice%40example.com`` lose their values.
- **Line breaks inside a key.** The key shapes also run over the text with its line
  breaks taken out, so a key cut over two lines goes whole (with, at worst, the word
  that starts the next line).

Every pattern runs on RE2 and every view is built in one pass: the time stays linear in
the text.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._placeholders import StandIns
from agent_blackbox.outbox._shapes import Shape
from agent_blackbox.outbox._shapes_v3 import SHAPES_V3
from agent_blackbox.outbox._text_views import (
    INVISIBLE_RUN,
    LOOKALIKES,
    View,
    normalised,
    percent_decoded,
    without,
)

_ROUNDS = 3
_SHORT = 256
_DATA_DEPTH = 2
"""How deep ``data:`` URLs inside decoded ``data:`` URL bodies are decoded."""

_LINE_BREAKS = re2.compile(r"[\r\n\x0b\x0c\x{85}\x{2028}\x{2029}]+")
_DATA_URL = re2.compile(
    r"(?i)data:[^\s,;]{0,100}(?:;[^\s,;]{0,100}){0,8};base64,([A-Za-z0-9+/_-]+={0,2})"
)
_URL_SAFE = str.maketrans("-_", "+/")


def _decoded_body(body: str) -> str | None:
    """A ``data:`` URL's base64 body as text (UTF-8, else byte for byte); None when it
    is not base64."""
    stripped = body.translate(_URL_SAFE).rstrip("=")
    try:
        raw = base64.b64decode(stripped + "=" * (-len(stripped) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


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

    __slots__ = ("_any_hint", "_keys", "_labels", "_shapes", "_stand_ins")

    def __init__(self, names: Iterable[str], stand_ins: StandIns) -> None:
        chosen = tuple(names)
        self._shapes: tuple[Shape, ...] = tuple(SHAPES_V3[n] for n in chosen)
        self._keys = SHAPES_V3["api_key"] if "api_key" in chosen else None
        self._labels = tuple(dict.fromkeys(shape.label for shape in self._shapes))
        hints = {hint for shape in self._shapes for hint in shape.hints} | {"%", "base64,"}
        ordered = sorted(hints, key=len, reverse=True)
        self._any_hint = re.compile("|".join(map(re.escape, ordered)))
        self._stand_ins = stand_ins

    def scan(self, text: str, fired: set[str], depth: int = 0) -> str:
        """``text`` with every version 3 detector applied (``depth``: how many
        ``data:`` URL bodies deep it was decoded from). Unchanged when nothing fires;
        otherwise the normalised text, redacted."""
        normal = normalised(text)
        folded = normal if normal.isascii() else normal.translate(LOOKALIKES)
        lowered = folded.lower()
        if len(lowered) < _SHORT and self._any_hint.search(lowered) is None:
            return text
        hit = False
        if "base64," in lowered and depth < _DATA_DEPTH:
            spans = self._data_urls(folded, fired, depth)
            if spans:
                normal, folded = self._replaced(spans, normal, folded)
                hit = True
        # A placeholder ends a word, so it may let a detector match next to it that could
        # not before: rounds go on until one changes nothing (redacting twice is then
        # redacting once), and at most _ROUNDS of them, which keeps the work linear.
        for _ in range(_ROUNDS):
            changed = False
            lowered = folded.lower()
            for shape in self._shapes:
                if not _holds(lowered, shape.hints):
                    continue
                found = shape.find(folded)
                if found:
                    labelled = [(start, end, shape.label) for start, end in found]
                    normal, folded = self._replaced(labelled, normal, folded)
                    fired.add(shape.label)
                    changed = True
            spans = self._in_views(folded)
            if spans:
                normal, folded = self._replaced(spans, normal, folded)
                fired.update(label for _, _, label in spans)
                changed = True
            if not changed:
                break
            hit = True
        return normal if hit else text

    def _data_urls(self, folded: str, fired: set[str], depth: int) -> list[Span]:
        """The bodies of ``data:`` URLs in which some rule fires, each with the label of
        the first such rule."""
        spans: list[Span] = []
        for match in _DATA_URL.finditer(folded):
            start, end = match.span(1)
            body = _decoded_body(folded[start:end])
            if body is None:
                continue
            inside: set[str] = set()
            self.scan(body, inside, depth + 1)
            if inside:
                fired.update(inside)
                label = next((lb for lb in self._labels if lb in inside), sorted(inside)[0])
                spans.append((start, end, label))
        return spans

    def _in_views(self, folded: str) -> list[Span]:
        """What the detectors find in the percent-decoded view of ``folded`` and the key
        shapes across its line breaks, as spans of ``folded`` (overlaps merged)."""
        found: list[Span] = []
        decoded = percent_decoded(folded)
        if decoded is not None:
            decoded = without(decoded, INVISIBLE_RUN) or decoded
            found += _found(decoded, self._shapes)
        base: View | str = folded if decoded is None else decoded
        text = base.text if isinstance(base, View) else base
        keys = self._keys
        if keys is not None and _LINE_BREAKS.search(text) is not None:
            joined = without(base, _LINE_BREAKS) if _holds(text.lower(), keys.hints) else None
            if joined is not None:
                found += _found(joined, (keys,))
        return _merged(found)

    def _replaced(self, spans: list[Span], normal: str, folded: str) -> tuple[str, str]:
        """``normal`` and ``folded`` with each span replaced by its label's stand-in."""
        normal_parts: list[str] = []
        folded_parts: list[str] = []
        last = 0
        for start, end, label in spans:
            stand_in = self._stand_ins.of(label, normal[start:end])
            normal_parts += (normal[last:start], stand_in)
            folded_parts += (folded[last:start], stand_in)
            last = end
        return "".join((*normal_parts, normal[last:])), "".join((*folded_parts, folded[last:]))


def _found(view: View, shapes: Iterable[Shape]) -> list[Span]:
    """The spans (of the scanned text) of what ``shapes`` find in ``view``."""
    lowered = view.text.lower()
    spans: list[Span] = []
    for shape in shapes:
        if _holds(lowered, shape.hints):
            spans += ((*view.origin(s, e), shape.label) for s, e in shape.find(view.text))
    return spans


def _merged(spans: list[Span]) -> list[Span]:
    """``spans`` in order, each overlapping run of them merged into one (the first's
    label)."""
    merged: list[Span] = []
    for start, end, label in sorted(spans):
        if merged and start < merged[-1][1]:
            first_start, first_end, first_label = merged[-1]
            merged[-1] = (first_start, max(first_end, end), first_label)
        else:
            merged.append((start, end, label))
    return merged


def _holds(text: str, hints: tuple[str, ...]) -> bool:
    # A plain loop: any() over a generator costs more than the searches themselves.
    for hint in hints:  # noqa: SIM110
        if hint in text:
            return True
    return False
