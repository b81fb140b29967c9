"""Matching text: where the detectors of one version run over a string.

A scan replaces what its detectors find in one string by stand-ins and adds the names of
the rules that fired to a set. Version 1 runs its detectors as one combined pattern of
Python's engine (:class:`PatternScan`); version 2 runs its shapes on RE2 over a
normalised copy of the text (:class:`ShapeScan`), in windows when the text is long, so a
crafted string can neither hide a secret nor stall the recorder.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Protocol

from agent_blackbox.outbox._detectors import DETECTORS, combine
from agent_blackbox.outbox._placeholders import StandIns
from agent_blackbox.outbox._shapes import SHAPES, Shape

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


class TextScan(Protocol):
    """Redacts one string by the detectors of one version."""

    def scan(self, text: str, fired: set[str]) -> str:
        """``text`` with what the detectors found replaced; ``text`` itself when
        nothing fired. Adds the names of the rules that fired to ``fired``."""
        ...


def windows(value: str) -> Iterator[str]:
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


class PatternScan:
    """The version 1 scan: the detectors ``names`` (of
    :data:`~agent_blackbox.outbox._detectors.DETECTORS`) as one pattern, run only on
    strings that hold one of their hints.

    Args:
        names: the detectors in force, in the order they are tried.
        stand_ins: what replaces a match.
    """

    __slots__ = ("_gates", "_patterns", "_stand_ins")

    def __init__(self, names: Iterable[str], stand_ins: StandIns) -> None:
        self._gates = tuple((n, DETECTORS[n].hints, DETECTORS[n].folded) for n in names)
        self._stand_ins = stand_ins
        # One combined pattern per set of detectors a string's hints call for, compiled on
        # first use: there are at most 2**5, and most strings need the same few.
        self._patterns: dict[tuple[str, ...], re.Pattern[str]] = {}

    def scan(self, text: str, fired: set[str]) -> str:
        """``text`` with every match of the detectors in force replaced."""
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
            pattern = self._patterns[key] = combine(key)
        return pattern

    def _replace(self, match: re.Match[str], hits: list[str]) -> str:
        name = str(match.lastgroup)  # every alternative is a named group
        accepts = DETECTORS[name].accepts
        if accepts is not None and not accepts(match.group()):
            return match.group()
        hits.append(name)
        return self._stand_ins.of(name, match.group())


class ShapeScan:
    """The version 2 scan: the shapes ``names`` (of
    :data:`~agent_blackbox.outbox._shapes.SHAPES`), each run only on strings that hold
    one of its hints, over the text normalised.

    Args:
        names: the shapes in force, in the order they run.
        stand_ins: what replaces a match.
    """

    __slots__ = ("_any_hint", "_shapes", "_stand_ins")

    def __init__(self, names: Iterable[str], stand_ins: StandIns) -> None:
        self._shapes: tuple[Shape, ...] = tuple(SHAPES[n] for n in names)
        hints = sorted({hint for shape in self._shapes for hint in shape.hints}, key=len)
        self._any_hint = re.compile("|".join(map(re.escape, reversed(hints))) or "(?!)")
        self._stand_ins = stand_ins

    def scan(self, text: str, fired: set[str]) -> str:
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


def _holds(text: str, hints: tuple[str, ...]) -> bool:
    # A plain loop: any() over a generator costs more than the searches themselves.
    for hint in hints:  # noqa: SIM110
        if hint in text:
            return True
    return False
