"""Safe display of recorded text on a terminal.

Payloads are written by models, tools and users, so anything shown from them (CLI
timelines, reports, divergence details) may carry terminal escape sequences, bidi
overrides that reorder what a reader sees, invisible characters, or Rich console markup.
:func:`safe_text` turns all of that into visible escapes, so what is printed is what
was recorded, and printing it cannot retitle a window, move the cursor, rewrite a
link, hide a line, or restyle the rest of the output. :func:`safe_console` is the one
way the project makes a console: it never turns ``:name:`` shortcodes into emoji.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

ELLIPSIS = "…"

# Categories that never have a visible glyph of their own and can make text lie:
# controls (C0, DEL, C1), format characters (bidi embeddings, overrides and isolates,
# zero-width spaces and joiners, BOM, soft hyphen, tag characters), the line and
# paragraph separators, and lone surrogates (which also make a print fail).
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})

# Letters that render as blank space (Hangul fillers): text after them looks empty.
_BLANK_LETTERS = "\u115f\u1160\u3164\uffa0"

# The planes those categories live in: 0 (BMP), 1 (SMP) and 14 (tags, variation
# selectors); planes 2-3 are ideographs and 15-16 private use. Scanning only these
# takes ~10 ms instead of ~120 ms; a unit test checks the whole code space.
_SCANNED = (range(0x0, 0x20000), range(0xE0000, 0xE1000))

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# Where Rich parses a tag: "[" then a lower-case letter, "#", "/" or "@". Unlike Rich's
# own escape no closing "]" is required, so a payload cannot open a tag that markup
# the caller appends after it closes. Backslashes right before such a "[" are doubled
# (Rich halves a run of them), and so are backslashes at the very end, which would
# otherwise escape the caller's next tag.
_MARKUP = r"(\\*)\[(?=[a-z#/@])|(\\+)\Z"


# What may need escaping in ASCII text: C0 controls, DEL, "[" and backslash. One
# character class is searched several times faster than the full pattern's alternatives.
_ASCII_SCREEN = re.compile(r"[\x00-\x1f\x7f\[\\]")


@cache
def _hidden_class() -> str:
    """The body of one regex character class of every hidden character (see the module
    docstring), built on first use from the running Python's Unicode database."""
    hidden = [
        chr(code)
        for codes in _SCANNED
        for code in codes
        if unicodedata.category(chr(code)) in _HIDDEN_CATEGORIES
    ]
    hidden.extend(_BLANK_LETTERS)
    return _class(hidden)


@cache
def hidden_characters() -> re.Pattern[str]:
    """A pattern matching one hidden character: what :func:`safe_text` and
    :func:`visible_text` show as an escape (controls, format and bidi characters, line
    and paragraph separators, lone surrogates, blank-rendering letters). For writers
    of other formats that escape the same characters their own way."""
    return re.compile(f"[{_hidden_class()}]")


@cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The pattern of everything :func:`safe_text` rewrites (hidden characters, and
    markup openings), and a one-class screen for non-ASCII text that finds every
    character that may start a match."""
    chars = _hidden_class()
    return re.compile(f"([{chars}])|{_MARKUP}"), re.compile(f"[{chars}\\[\\\\]")


def _class(chars: list[str]) -> str:
    """A regex character class body of ``chars``, with consecutive runs as ranges."""
    codes = sorted({ord(c) for c in chars})
    parts: list[str] = []
    start = previous = codes[0]
    for code in [*codes[1:], -1]:
        if code == previous + 1:
            previous = code
            continue
        parts.append(_esc(start) if start == previous else f"{_esc(start)}-{_esc(previous)}")
        start = previous = code
    return "".join(parts)


def _esc(code: int) -> str:
    return f"\\U{code:08x}" if code > 0xFFFF else f"\\u{code:04x}"


def _visible(char: str) -> str:
    """The escape a hidden character is shown as: ``\\n``, ``\\x1b``, ``\\u202e``..."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _replace(match: re.Match[str]) -> str:
    hidden, before_tag, at_end = match.groups()
    if hidden is not None:
        return _visible(hidden)
    if at_end is not None:
        return at_end * 2
    return before_tag * 2 + "\\["


def safe_text(value: object, *, limit: int | None = None) -> str:
    """``value`` as text that is safe to print on a terminal or through Rich markup.

    Control characters (every C0 one, including newline, carriage return and tab; DEL;
    every C1 one), and with them ANSI and OSC escape sequences; Unicode format
    characters (bidi overrides and isolates, zero-width characters, the BOM, ...), the
    line and paragraph separators, lone surrogates and blank-rendering fillers become
    visible escapes (``\\n``, ``\\x1b``, ``\\x9b``, ``\\u202e``). A Rich tag opening
    ``[`` becomes ``\\[``. Other text, including every printable non-ASCII letter, is
    unchanged.

    Args:
        value: what to show; anything but a ``str`` is shown as its ``str()``.
        limit: at most this many characters out, the last of them an ellipsis when
            cut; an escape is never cut in half.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    text = value if type(value) is str else str(value)
    pattern, screen = _patterns()
    if (_ASCII_SCREEN if text.isascii() else screen).search(text) is not None:
        out = pattern.sub(_replace, text)
        if limit is not None and len(out) > limit:
            return _cut(text, pattern, limit)
        return out
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + ELLIPSIS


def visible_text(value: object) -> str:
    """``value`` as text whose hidden characters are visible escapes, as :func:`safe_text`
    shows them, for a page rather than a terminal: nothing else changes (a page escapes
    its own markup, so ``[`` stays ``[``)."""
    text = value if type(value) is str else str(value)
    pattern, screen = _patterns()
    if (_ASCII_SCREEN if text.isascii() else screen).search(text) is None:
        return text
    return pattern.sub(lambda m: m[0] if m[1] is None else _visible(m[1]), text)


def _cut(text: str, pattern: re.Pattern[str], limit: int) -> str:
    """The first ``limit - 1`` characters of the escaped ``text`` and an ellipsis,
    dropping an escape that does not fit whole rather than cutting it in half."""
    pieces: list[str] = []
    room = limit - 1
    position = 0
    for match in pattern.finditer(text):
        plain = text[position : match.start()]
        if len(plain) >= room:
            pieces.append(plain[:room])
            break
        pieces.append(plain)
        room -= len(plain)
        escaped = _replace(match)
        if len(escaped) > room:
            break
        pieces.append(escaped)
        room -= len(escaped)
        position = match.end()
    else:
        pieces.append(text[position:][:room])
    return "".join(pieces) + ELLIPSIS


def safe_console(*, stderr: bool = False, **options: Any) -> Console:
    """A Rich console for the project's output: emoji shortcodes (``:smile:``) in printed
    text are shown as written, never replaced.

    Markup stays on for the project's own styling (``[red]DIVERGED[/]``), so every run
    id, name and payload-derived text printed on it must pass :func:`safe_text`, which
    escapes markup openings and every control and invisible character.

    Args:
        stderr: write to standard error instead of standard output.
        options: any other :class:`rich.console.Console` argument except ``emoji``.
    """
    from rich.console import Console  # here: importing the schemas does not load Rich

    return Console(stderr=stderr, emoji=False, **options)
