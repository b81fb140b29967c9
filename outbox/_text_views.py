"""Views of a text for matching: percent-decoded, or with some characters taken out, and
where each character of the view came from.

A secret can hide behind an encoding a detector does not read (``api%5Fkey=``,
``alice%40example.com``) or behind characters inserted to break its shape (a line break
inside a key). Redaction version 3 runs its detectors over such views too, and replaces
in the text itself what a match covers there: a :class:`View` maps each span of its text
back to the span of the text it was made from.

Every view is built in one pass over the text (a linear-time pattern finds the pieces to
change; the stretches between are kept whole), and a span is mapped back by a binary
search over the changed pieces.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox._text_scan import _INVISIBLE, _LOOKALIKES

# Beyond version 2's: variation selectors (U+FE0F after a letter is drawn as nothing),
# the tag characters, Mongolian variation selectors, Hangul fillers, the Arabic letter mark.
_MORE_INVISIBLE = (
    range(0xFE00, 0xFE10),
    range(0xE0000, 0xE0080),
    range(0xE0100, 0xE01F0),
    range(0x180B, 0x1810),
    (0x115F, 0x1160, 0x3164, 0xFFA0, 0x061C),
)
INVISIBLE_V3 = {**_INVISIBLE, **dict.fromkeys((c for r in _MORE_INVISIBLE for c in r), None)}
"""What version 3 removes before matching: version 2's invisible characters and more."""
_INVISIBLE_CLASS = "".join(f"\\x{{{code:x}}}" for code in sorted(INVISIBLE_V3))
INVISIBLE_RUN = re2.compile(f"[{_INVISIBLE_CLASS}]+")
LOOKALIKES = _LOOKALIKES
"""Look-alike letters of other scripts and their Latin twins, one for one (version 2's)."""
_PERCENT_RUN = re2.compile(r"(?:%[0-9A-Fa-f]{2})+")
_PERCENT_ROUNDS = 2
"""How many times a text is percent-decoded: twice catches ``%255F`` (``%5F`` encoded
again), the most a client's double encoding gives."""


@dataclass(frozen=True, slots=True)
class _Piece:
    """A changed piece: ``[start, end)`` of the view came from ``[origin, origin_end)``.
    With ``scale``, each character of the view came from ``scale`` characters of the
    origin (``%41`` gives ``A``: 3); without (0), only the piece as a whole maps."""

    start: int
    end: int
    origin: int
    origin_end: int
    scale: int


class View:
    """A text derived from ``origin`` by changing some pieces of it.

    Args:
        text: the derived text.
        pieces: the changed pieces, in order, none overlapping.
        below: the view ``origin`` itself is, when views are stacked (None: the scanned
            text).
    """

    __slots__ = ("_below", "_pieces", "_starts", "text")

    def __init__(self, text: str, pieces: Sequence[_Piece], below: View | None = None) -> None:
        self.text = text
        self._pieces = pieces
        self._starts = [piece.start for piece in pieces]
        self._below = below

    def origin(self, start: int, end: int) -> tuple[int, int]:
        """The span of the scanned text that ``[start, end)`` of this view came from (a
        piece partly covered is covered whole, unless its characters map one by one)."""
        span = (self._origin_start(start), self._origin_end(end))
        return span if self._below is None else self._below.origin(*span)

    def _origin_start(self, at: int) -> int:
        i = bisect_right(self._starts, at) - 1
        if i < 0:
            return at
        piece = self._pieces[i]
        if at < piece.end:
            return piece.origin + (at - piece.start) * piece.scale
        return piece.origin_end + (at - piece.end)

    def _origin_end(self, at: int) -> int:
        i = bisect_left(self._starts, at) - 1
        if i < 0:
            return at
        piece = self._pieces[i]
        if at <= piece.end:
            return (
                piece.origin + (at - piece.start) * piece.scale if piece.scale else piece.origin_end
            )
        return piece.origin_end + (at - piece.end)


def normalised(text: str) -> str:
    """``text`` as version 3 matches it before folding look-alikes: NFKC, with the
    invisible characters of :data:`INVISIBLE_V3` removed."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(INVISIBLE_V3)


def _derived(
    text: str, pattern: Any, change: Callable[[str], tuple[str, int] | None], below: View | None
) -> View | None:
    """The view of ``text`` with each match of ``pattern`` changed by ``change`` (which
    gives the new text and its scale, or None to keep the match); None when nothing
    changed."""
    parts: list[str] = []
    pieces: list[_Piece] = []
    last = shift = 0
    for match in pattern.finditer(text):
        start, end = match.span()
        changed = change(text[start:end])
        if changed is None:
            continue
        new, scale = changed
        parts += (text[last:start], new)
        pieces.append(_Piece(start + shift, start + shift + len(new), start, end, scale))
        shift += len(new) - (end - start)
        last = end
    if not pieces:
        return None
    parts.append(text[last:])
    return View("".join(parts), pieces, below)


def _percent_decoded(run: str) -> tuple[str, int] | None:
    raw = bytes.fromhex(run.replace("%", ""))
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None  # not text: left as it is
    return decoded, 3 if raw.isascii() else 0


def percent_decoded(base: str | View) -> View | None:
    """``base`` with its ``%XX`` escapes decoded (UTF-8; a run that is not UTF-8 is
    kept), twice when the first decoding leaves escapes; None when it holds none."""
    view = base if isinstance(base, View) else None
    text = base.text if isinstance(base, View) else base
    decoded: View | None = None
    for _ in range(_PERCENT_ROUNDS):
        if "%" not in text:
            break
        again = _derived(text, _PERCENT_RUN, _percent_decoded, view)
        if again is None:
            break
        view = decoded = again
        text = again.text
    return decoded


def without(base: str | View, pattern: Any) -> View | None:
    """``base`` with every match of ``pattern`` taken out; None when nothing matched."""
    if isinstance(base, View):
        return _derived(base.text, pattern, lambda _match: ("", 0), base)
    return _derived(base, pattern, lambda _match: ("", 0), None)
