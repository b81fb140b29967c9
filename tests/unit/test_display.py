"""Safe display: nothing from a payload can drive the terminal or Rich markup."""

from __future__ import annotations

import io
import sys
import unicodedata
from typing import Any

import pytest
from rich.console import Console

from agent_blackbox.schemas._display import ELLIPSIS, safe_text

HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs"}


def _rendered(markup: str) -> str:
    """What Rich prints for ``markup`` with markup on, as plain text."""
    out = io.StringIO()
    Console(file=out, force_terminal=False, color_system=None, width=10_000).print(
        markup, end="", soft_wrap=True, highlight=False
    )
    return out.getvalue()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # OSC: set the window title
        ("\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\", None),  # OSC 8 hyperlink
        ("\x9b2J", "\\x9b2J"),  # C1 CSI: clear the screen
        ("\x9d0;title\x9c", "\\x9d0;title\\x9c"),  # C1 OSC and ST
        ("pay\u202eusd01", "pay\\u202eusd01"),  # bidi override
        ("a\u2066b\u2069c", "a\\u2066b\\u2069c"),  # bidi isolate
        ("nul\x00byte", "nul\\x00byte"),
        ("two\nlines\r\n", "two\\nlines\\r\\n"),
        ("tab\there", "tab\\there"),
        ("del\x7f", "del\\x7f"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("bell\x07", "bell\\x07"),
        ("lone \udc80 surrogate", "lone \\udc80 surrogate"),
        ("tag \U000e0041", "tag \\U000e0041"),
        ("filler\u3164", "filler\\u3164"),
    ],
)
def test_terminal_controls_become_visible_escapes(raw: str, shown: str | None) -> None:
    out = safe_text(raw)
    if shown is not None:
        assert out == shown
    assert "\x1b" not in out
    assert "\x07" not in out
    assert not any(unicodedata.category(c) in HIDDEN for c in out)
    out.encode("utf-8")  # printable: no lone surrogate left


@pytest.mark.parametrize(
    "raw",
    [
        "[bold red]alarm[/bold red]",
        "[link=https://evil.example]x[/link]",
        "[/]",
        "[#ff0000]x",
        "[@click=app.quit]x",
        "\\[bold]x",  # a backslash of the payload's own must not un-escape the tag
        "\\\\[bold]x",
    ],
)
def test_rich_markup_is_shown_not_applied(raw: str) -> None:
    out = safe_text(raw)
    assert _rendered(out) == raw
    # Nor can the payload open a tag that the caller's markup would close.
    assert _rendered(f"[dim]{out}[/dim]") == raw


def test_a_trailing_backslash_cannot_escape_the_callers_markup() -> None:
    out = safe_text("C:\\temp\\")
    assert out == "C:\\temp\\\\"
    assert _rendered(f"[dim]{out}[/dim]") == "C:\\temp\\"


def test_json_with_a_word_in_brackets_is_escaped_since_rich_would_take_it_as_a_tag() -> None:
    text = '{"a": [true], "b": [null]}'
    assert _rendered(text) != text  # Rich would swallow it
    assert _rendered(safe_text(text)) == text


def test_brackets_that_are_not_markup_stay_as_they_are() -> None:
    for text in ("[1, 2, 3]", "a[0] = [Errno 2]", "x[", "]", "[[", "[ ]"):
        assert safe_text(text) == text
        assert _rendered(safe_text(text)) == text


@pytest.mark.parametrize(
    "text", ["plain ascii", "", "Grüße, 東京, мир, ✓, 🙂", "tabs?\\no, a backslash-n"]
)
def test_plain_text_is_unchanged(text: str) -> None:
    assert safe_text(text) == text


def test_any_value_is_shown_as_its_str() -> None:
    assert safe_text(42) == "42"
    assert safe_text(None) == "None"
    assert safe_text(ValueError("bad\x1b[2J")) == "bad\\x1b[2J"


def test_limit_truncates_with_an_ellipsis() -> None:
    assert safe_text("abcdef", limit=6) == "abcdef"
    assert safe_text("abcdefg", limit=6) == "abcde" + ELLIPSIS
    assert safe_text("abc", limit=1) == ELLIPSIS
    assert safe_text("\x1b[1m", limit=10) == "\\x1b[1m"


def test_limit_never_cuts_an_escape_in_half() -> None:
    text = "ab\x1bcd\u202eef[bold]gh"
    full = safe_text(text)
    for limit in range(1, len(full) + 2):
        out = safe_text(text, limit=limit)
        assert len(out) <= limit
        if len(full) <= limit:
            assert out == full
            continue
        assert out.endswith(ELLIPSIS)
        kept = out[: -len(ELLIPSIS)]
        assert full.startswith(kept)
        # The cut falls between escapes: after some whole characters of the input
        # (a tag letter appended keeps a final "[" escaped as it is in context).
        whole = {len(safe_text(text[:n] + "b")) - 1 for n in range(len(text) + 1)}
        assert len(kept) in whole, (limit, out)


def test_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        safe_text("x", limit=0)


def test_no_code_point_up_to_0x3000_survives_as_a_control_or_format_character() -> None:
    for code in range(0x3001):
        char = chr(code)
        out = safe_text(f"a{char}b")
        assert not any(unicodedata.category(c) in HIDDEN for c in out), hex(code)
        assert not any(0x2066 <= ord(c) <= 0x2069 or 0x202A <= ord(c) <= 0x202E for c in out)
        if unicodedata.category(char) not in HIDDEN and char not in "[\\\u115f\u1160":
            assert out == f"a{char}b", hex(code)


def test_every_hidden_code_point_is_escaped() -> None:
    # The pattern is built from the planes these categories live in; hold it to the
    # whole code space of the running Python's Unicode database.
    hidden = [
        chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)) in HIDDEN
    ]
    out = safe_text("".join(hidden))
    assert not any(unicodedata.category(c) in HIDDEN for c in out)
    assert out.count("\\") == len(hidden)


def test_a_timeline_of_a_hostile_run_prints_no_control_sequence() -> None:
    import io

    from rich.console import Console

    from agent_blackbox.outbox import MemoryRecorder, RunSnapshot
    from agent_blackbox.replayer._timeline import timeline_table
    from agent_blackbox.schemas import PayloadPipeline

    hostile = "\x1b]0;owned\x07\x1b[2J[bold red]boom[/]\u202ereversed\x9b31m"

    def agent(run: Any, input: Any) -> Any:
        return run.call("echo", lambda text: text, hostile)

    recorder = MemoryRecorder()
    run, _ = recorder.record(agent, RunSnapshot("t.1", hostile), agent_id="x")
    out = io.StringIO()
    table = timeline_table(run.run_id, recorder.events, pipeline=PayloadPipeline())
    Console(file=out, force_terminal=True, color_system=None, width=400).print(table)
    printed = out.getvalue()
    for forbidden in ("\x1b]", "\x1b[2J", "\x07", "\u202e", "\x9b"):
        assert forbidden not in printed
    assert "[bold red]boom" in printed  # shown as text, not interpreted
