"""Views of a text for matching: percent-decoded, or with some characters taken out, and
where each character of the view came from.

A secret can hide behind an encoding a detector does not read (``api%5Fkey=``,
``alice%40example.com``) or behind characters inserted to break its shape (a line break
inside a key). Redaction version 3 runs its detectors over such views too, and replaces
in the text itself what a match covers there: a :class:`View` maps each span of its text
back to the span of the text it was made from.

Every view is built in one pass over the text, and a span is mapped back by a binary
search over the changed pieces. The pieces to change are found by patterns that are runs
of one character class or of one fixed-width escape, which even a backtracking engine
matches in linear time; Python's engine runs them (RE2's wrapper maps the offsets of each
match in a ``str``, which costs more than these matches do).
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import Any

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


def _class_of(codes: Iterable[int]) -> str:
    """A character class of ``codes``, as ranges (a class listing hundreds of characters
    one by one is matched several times slower)."""
    ranges: list[list[int]] = []
    for code in sorted(codes):
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return "".join(
        re.escape(chr(low)) + ("" if low == high else "-" + re.escape(chr(high)))
        for low, high in ranges
    )


INVISIBLE_RUN = re.compile(f"([{_class_of(INVISIBLE_V3)}]+)")
LOOKALIKES = {**_LOOKALIKES, **dict.fromkeys(range(0xD800, 0xE000), 0xFFFD)}
"""Look-alike letters of other scripts and their Latin twins, one for one (version 2's),
and lone surrogates (a JSON string may hold one) as U+FFFD: matching runs on UTF-8."""
_PERCENT_RUN = re.compile(r"((?:%[0-9A-Fa-f]{2})+)")
_PERCENT_ROUNDS = 2
"""How many times a text is percent-decoded: twice catches ``%255F`` (``%5F`` encoded
again), the most a client's double encoding gives."""


@dataclass(slots=True)
class _Pieces:
    """The changed pieces of a view, in order, none overlapping: piece ``i`` is
    ``[starts[i], ends[i])`` of the view and came from ``[origins[i], origin_ends[i])``.
    With ``scales[i]``, each of its characters came from that many characters of the
    origin (``%41`` gives ``A``: 3); with 0, only the piece as a whole maps."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    origin_ends: list[int] = field(default_factory=list)
    scales: list[int] = field(default_factory=list)


class View:
    """A text derived from another (the scanned text, or a view of it) by changing
    some pieces of it.

    Args:
        text: the derived text.
        pieces: the changed pieces.
        below: the view the text was derived from, when views are stacked (None: the
            scanned text).
    """

    __slots__ = ("_below", "_pieces", "text")

    def __init__(self, text: str, pieces: _Pieces, below: View | None = None) -> None:
        self.text = text
        self._pieces = pieces
        self._below = below

    def origin(self, start: int, end: int) -> tuple[int, int]:
        """The span of the scanned text that ``[start, end)`` of this view came from (a
        piece partly covered is covered whole, unless its characters map one by one)."""
        [span] = self.origins([(start, end)])
        return span

    def origins(self, spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """:meth:`origin` of each of ``spans``, in one loop (a crafted text may give a
        span every few characters: the calls per span are what such a text costs)."""
        p = self._pieces
        starts, ends, origins, origin_ends, scales = (
            p.starts,
            p.ends,
            p.origins,
            p.origin_ends,
            p.scales,
        )
        mapped: list[tuple[int, int]] = []
        for start, end in spans:
            i = bisect_right(starts, start) - 1
            if i < 0:
                first = start
            elif start < ends[i]:
                first = origins[i] + (start - starts[i]) * scales[i]
            else:
                first = origin_ends[i] + (start - ends[i])
            i = bisect_left(starts, end) - 1
            if i < 0:
                last = end
            elif end <= ends[i]:
                last = origins[i] + (end - starts[i]) * scales[i] if scales[i] else origin_ends[i]
            else:
                last = origin_ends[i] + (end - ends[i])
            mapped.append((first, last))
        return mapped if self._below is None else self._below.origins(mapped)


_LOOKALIKE = re.compile(f"[{_class_of(LOOKALIKES)}]")

# ``str.translate`` looks every character of a text up in its table, a search for the
# table's characters (one class, in C) costs a tenth of that: on a long text that holds
# none of them, the translation is skipped, with the same result.


def normalised(text: str) -> str:
    """``text`` as version 3 matches it before folding look-alikes: NFKC, with the
    invisible characters of :data:`INVISIBLE_V3` removed."""
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKC", text)
    return text.translate(INVISIBLE_V3) if INVISIBLE_RUN.search(text) is not None else text


def folded(text: str) -> str:
    """``text`` with its look-alike letters and lone surrogates folded
    (:data:`LOOKALIKES`)."""
    if text.isascii() or _LOOKALIKE.search(text) is None:
        return text
    return text.translate(LOOKALIKES)


def _derived(
    text: str, pattern: Any, change: Callable[[str], tuple[str, int]], below: View | None
) -> View | None:
    """The view of ``text`` with each match of ``pattern`` (which has one group, the
    whole match) changed by ``change`` into a new text and its scale; None when
    ``pattern`` does not match.

    Written as passes over lists rather than one loop over matches: a crafted text
    holds a match every few characters, and each pass costs a fraction of a loop's turn.
    """
    parts = pattern.split(text)  # literal, match, literal, ..., literal
    if len(parts) == 1:
        return None
    literals, found = parts[0::2], parts[1::2]
    changed = [change(piece) for piece in found]
    news = [new for new, _ in changed]
    # Piece i starts after literals 0..i and, in the view, after the new texts before it
    # (in the origin, after the matches before it).
    literals_to = list(accumulate(map(len, literals[:-1])))
    news_before = accumulate(map(len, news[:-1]), initial=0)
    found_before = accumulate(map(len, found[:-1]), initial=0)
    starts = [a + b for a, b in zip(literals_to, news_before, strict=True)]
    origins = [a + b for a, b in zip(literals_to, found_before, strict=True)]
    pieces = _Pieces(
        starts=starts,
        ends=[start + len(new) for start, new in zip(starts, news, strict=True)],
        origins=origins,
        origin_ends=[at + len(piece) for at, piece in zip(origins, found, strict=True)],
        scales=[scale for _, scale in changed],
    )
    merged = [""] * (len(literals) + len(news))
    merged[0::2], merged[1::2] = literals, news
    return View("".join(merged), pieces, below)


@lru_cache(maxsize=1024)  # the same few escapes (%20, %2F, %40...) come again and again
def _percent_decoded(run: str) -> tuple[str, int]:
    raw = bytes.fromhex(run.replace("%", ""))
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return run, 1  # not text: kept as it is, character for character
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
