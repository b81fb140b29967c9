"""Redaction version 3: its precision rules, the views it matches over, its corpus, and
version 2 kept reachable for the runs recorded under it."""

from __future__ import annotations

import base64
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import re2  # type: ignore[import-untyped]

from agent_blackbox.outbox import Redactor
from agent_blackbox.outbox._decoded_scan import _Hints, _holds
from agent_blackbox.outbox._placeholders import placeholder
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.outbox._shapes_v3 import (
    CREDENTIAL_PAIR_PATTERN,
    SHAPES_V3,
    _pair_check,
    _pair_value,
    is_card_field,
    is_card_value,
    is_real_domain,
    matches,
)
from agent_blackbox.outbox._text_views import percent_decoded, without
from agent_blackbox.replayer import read_archive, replay_run
from agent_blackbox.schemas import PayloadPipeline, canonical_text
from bench._redaction_corpus import EARLIER, secret_corpus
from tests.golden.record_redaction_v2 import agent as golden_agent

REDACTOR = Redactor()
EMAIL, CARD = placeholder("email"), placeholder("card_number")
CREDENTIAL = placeholder("credential")
GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "redaction" / "v2.avro"


def redact(value: Any) -> Any:
    return REDACTOR.redact(value).value


# --- e-mail addresses need a real domain -------------------------------------------------


@pytest.mark.parametrize(
    "domain",
    ["example.com", "mail.example.co.uk", "bücher.de", "例子.广告", "xn--bcher-kva.de", "163.com"],
)
def test_real_domains_are_domains(domain: str) -> None:
    assert is_real_domain(domain)


@pytest.mark.parametrize(
    "domain", ["2x.png", "3X.webp", "1.5x.jpg", "2x.zip", "4x.mov", "1.2.3-rc.beta", "small.pdf"]
)
def test_file_extensions_densities_and_versions_are_not(domain: str) -> None:
    assert not is_real_domain(domain)


@pytest.mark.parametrize(
    "text",
    ["logo@2x.png", "assets/icon-cart@3x.webp", "hero@1.5x.jpg", "@scope/pkg@1.2.0-rc.beta"],
)
def test_image_names_and_package_versions_are_kept(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("to josé@exämple.com now", f"to {EMAIL} now"),
        ("用户@例子.广告", EMAIL),
        ("email=alice%40example.com&x=1", f"email={EMAIL}&x=1"),
        ("ann@example.md", EMAIL),  # .md is Moldova's, not only a file extension
    ],
)
def test_addresses_with_real_domains_are_replaced(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- a card number needs context ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "order 4532015112830366 shipped",
        "id=4532015112830366",
        "4532015112830366",
        "discard 4532015112830366",  # "card" inside another word is no context
    ],
)
def test_bare_card_like_numbers_without_context_are_kept(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("card 4532015112830366", f"card {CARD}"),
        ("paid with 4532015112830366.", f"paid with {CARD}."),
        ("4532015112830366 (visa)", f"{CARD} (visa)"),
        ('"card_number": 4532015112830366.0', f'"card_number": {CARD}.0'),
        ("4532 0151 1283 0366", CARD),
        ("4532.0151.1283.0366", CARD),
        ("4532/0151/1283/0366", CARD),
        ("3782-822463-10005", CARD),
    ],
)
def test_cards_with_a_word_or_a_grouping_are_replaced(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_numbers_where_a_card_is_expected_are_replaced() -> None:
    value = {
        "card": 4532015112830366.0,
        "cardNumber": 4532015112830366,
        "cc_num": "4532 0151 1283 0366",
        "payment": {"number": "4532015112830366", "exp_month": 4, "cvc": "123"},
        "credit_card": {"number": 4532015112830366, "brand": "visa"},
        "order_id": 4532015112830366,
        "id": 4532015112830366.0,
        "cards": [4532015112830366, "n/a"],
    }
    assert redact(value) == {
        "card": CARD,
        "cardNumber": CARD,
        "cc_num": CARD,
        "payment": {"number": CARD, "exp_month": 4, "cvc": "123"},
        "credit_card": {"number": CARD, "brand": "visa"},
        "order_id": 4532015112830366,
        "id": 4532015112830366.0,
        "cards": [CARD, "n/a"],
    }


@pytest.mark.parametrize(
    ("key", "expected"),
    [("card", True), ("cardNumber", True), ("cc_num", True), ("PAN", True), ("discard", False)],
)
def test_card_fields_are_named_by_words(key: str, expected: bool) -> None:
    assert is_card_field(key) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4532015112830366, True),
        (4532015112830367, False),  # fails Luhn
        (4532015112830366.0, True),
        (4.5320151128303661e18, True),  # past 2**53: the last digits are lost
        (45.5, False),
        ("4532-0151-1283-0366", True),
        ("card 4532015112830366", False),  # a field's value is the number, or it is text
        (True, False),
    ],
)
def test_card_values(value: object, expected: bool) -> None:
    assert is_card_value(value) is expected


# --- what hides a secret --------------------------------------------------------------------


def test_a_percent_decoded_view_maps_back_to_the_text() -> None:
    text = "q=1&api%5Fkey=abc&%2561=x"
    view = percent_decoded(text)
    assert view is not None
    assert view.text == "q=1&api_key=abc&a=x"
    start = view.text.index("api_key")
    assert text[slice(*view.origin(start, start + 7))] == "api%5Fkey"
    assert text[slice(*view.origin(start + 3, start + 4))] == "%5F"
    a = view.text.index("a=x")
    assert text[slice(*view.origin(a, a + 1))] == "%2561"  # decoded twice, mapped whole
    assert percent_decoded("50% off, 100%") is None


def test_a_view_without_line_breaks_maps_back_to_the_text() -> None:
    view = without("ab\r\ncd\nef", re.compile("([\r\n]+)"))
    assert view is not None
    assert view.text == "abcdef"
    assert view.origin(1, 3) == (1, 5)
    assert view.origin(2, 4) == (4, 6)  # "cd"
    assert view.origin(2, 5) == (4, 8)  # "cd\ne": the break inside comes along


def test_a_view_maps_many_spans_as_it_maps_each() -> None:
    """``origins`` (one loop, as the finders use it) gives what ``origin`` gives span by
    span, through stacked views, at piece edges and inside pieces."""
    rng = random.Random(31)
    units = ["a", "%41", "%2541", "\u200b", "\n", "key", "%5F", "=", " "]
    for _ in range(200):
        text = "".join(rng.choice(units) for _ in range(rng.randint(1, 30)))
        view = percent_decoded(text)
        if view is None:
            continue
        stacked = without(view, re.compile("([\u200b\n]+)")) or view
        size = len(stacked.text)
        edges = sorted(rng.randint(0, size) for _ in range(2 * rng.randint(1, 6)))
        spans = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2)]
        assert stacked.origins(spans) == [stacked.origin(*span) for span in spans], text


def test_match_offsets_in_a_text_of_any_script_are_its_characters() -> None:
    """Spans matched over UTF-8 bytes come back as the text's character offsets, for
    characters of one to four bytes and lone surrogates."""
    rng = random.Random(37)
    compiled = re2.compile(r"[a-z]+@\p{L}+")
    units = ["ab@cd", "é", "例", "\U0001f600", "\ud800", " ", "x@é", "@"]
    for _ in range(300):
        text = "".join(rng.choice(units) for _ in range(rng.randint(1, 25)))
        expected = [m.span() for m in re.finditer(r"[a-z]+@[^\W\d_]+", text)]
        assert list(matches(compiled, text)) == expected, text


def test_a_credential_pair_is_checked_once_as_it_would_be_each_time() -> None:
    """The pair check remembers each distinct pair: the spans it gives are those of the
    check itself, wherever the pair stands, for short pairs and past the memo's bound."""
    rng = random.Random(41)
    units = ["api", "_key", "%5F", "password", "=", ":", '\\"', "'", " ", "x", "&", "\\"]
    find = SHAPES_V3["credential_pair"].find
    found = 0
    for _ in range(300):
        pair = "".join(rng.choice(units) for _ in range(rng.randint(1, 20)))
        text = "a " + pair + " b " + pair + "x" * rng.choice([0, 300])
        spans = find(text)
        assert spans == _unmemoised_pairs(text), text
        found += len(spans)
    assert found > 50  # the texts hold pairs: the comparison is not of empty lists
    assert _pair_check("password=" + "v" * 300, 0, 309) == (9, 309)


def _unmemoised_pairs(text: str) -> list[tuple[int, int]]:
    found = []
    for start, end in matches(re2.compile(CREDENTIAL_PAIR_PATTERN), text):
        span = _pair_value(text, start, end)
        if span is not None:
            found.append(span)
    return found


def test_a_long_text_holds_a_shapes_hints_as_a_search_for_each_finds_them() -> None:
    """The hints of a long text, looked for together over its UTF-8, are those a search
    for each hint finds: in any script, with lone surrogates, for every shape's set."""
    rng = random.Random(43)
    hints = sorted({hint for shape in SHAPES_V3.values() for hint in shape.hints})
    units = [*hints, "é", "例", "\U0001f600", "\ud800", " ", "x", "k", "e", "y", "@"]
    for _ in range(200):
        text = "".join(rng.choice(units) for _ in range(rng.randint(0, 12)))
        text += "\u00e9" * rng.choice([0, 300, 5000])
        held = _Hints(text)
        for shape in SHAPES_V3.values():
            assert held.any(shape) == _holds(text, shape.hints), (text[:60], shape.hints)


def test_a_value_cut_short_by_a_decoded_space_goes_whole() -> None:
    assert redact("password=abc%20def&x=1") == f"password={CREDENTIAL}&x=1"
    assert redact("api%5Fkey=abc%20def&x=1") == f"api%5Fkey={CREDENTIAL}&x=1"


def test_a_key_cut_by_a_line_break_goes_whole_and_the_next_word_stays() -> None:
    key = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"
    assert redact(f"{key[:20]}\n{key[20:]} ok") == f"{placeholder('api_key')} ok"
    assert redact(f"key {key}\nThanks") == f"key {placeholder('api_key')}\nThanks"
    # A line that starts with the key's prefix is not joined to the line before it.
    assert redact(f"x\n{key[:3]}\n{key[3:]}") == f"x\n{placeholder('api_key')}"
    assert redact("id\nAKIA\nIOSFODNN7EXAMPLE") == f"id\n{placeholder('api_key')}"


def test_a_binary_data_url_is_scanned_for_credentials_only() -> None:
    image = bytes(range(256)) + b"contact ann@example.com" + bytes(range(256))
    keyed = bytes(range(256)) + b"api_key=Zq7vTb19KxQ2" + bytes(range(256))
    plain = "data:image/png;base64," + base64.b64encode(image).decode()
    assert redact(plain) == plain
    secret = "data:image/png;base64," + base64.b64encode(keyed).decode()
    assert redact(secret) == f"data:image/png;base64,{CREDENTIAL}"


def test_a_lone_surrogate_does_not_stop_redaction() -> None:
    assert redact("a\ud800 mail bob@example.com") == f"a\ud800 mail {EMAIL}"


# --- the corpus ---------------------------------------------------------------------------


def test_no_secret_of_the_corpus_survives() -> None:
    corpus = secret_corpus()
    scrub = Scrub(REDACTOR)
    missed = []
    for item in corpus:
        out = scrub.response(item.value, set()) if item.stream else redact(item.value)
        if item.secret in canonical_text(out):
            missed.append((item.shape, item.value))
    assert missed == []
    assert len({item.shape for item in corpus}) >= 30
    assert len(corpus) > 1000


def test_redacting_twice_is_redacting_once() -> None:
    for item in secret_corpus(variants=5):
        if not item.stream:
            once = redact(item.value)
            assert redact(once) == once, item.shape


# --- versions -----------------------------------------------------------------------------


def test_new_runs_record_version_3() -> None:
    assert REDACTOR.version == 3
    assert REDACTOR.config["version"] == 3


def test_version_2_is_as_it_was() -> None:
    old = Redactor(version=2)
    assert old.redact("logo@2x.png").value == EMAIL
    assert old.redact({"n": 4532015112830366}).value == {"n": CARD}
    assert old.redact("?api%5Fkey=Zq7vTb19Kx").value == "?api%5Fkey=Zq7vTb19Kx"
    for value, secret in EARLIER:  # and what it caught, it still catches
        assert secret not in canonical_text(old.redact(value).value)


def test_a_legacy_completions_stream_is_put_together_from_version_3_on() -> None:
    key = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"
    text = f"the key: {key} ok"
    chunks = [{"choices": [{"index": 0, "text": text[i : i + 5]}]} for i in range(0, len(text), 5)]
    joined = {}
    for version in (2, 3):
        out = Scrub(Redactor(version=version)).response({"stream": chunks}, set())
        joined[version] = "".join(c["choices"][0]["text"] for c in out["stream"])
    assert joined == {2: text, 3: text.replace(key, placeholder("api_key"))}


def test_a_run_recorded_under_version_2_replays_under_version_2() -> None:
    events = list(read_archive(GOLDEN_V2))
    started = PayloadPipeline().unpack(events[0])
    assert '"version":2' in events[0].attributes["redaction"]
    assert '"image":"[redacted:email]"' in started["input_json"]  # version 2 took it
    report = replay_run(events, golden_agent)
    assert report.passed, report.divergence and report.divergence.describe()


def test_the_same_run_replayed_under_version_3_diverges() -> None:
    # Proof that the replay above used version 2: under version 3 the tool call's
    # arguments are redacted otherwise, and their digest no longer matches.
    events = list(read_archive(GOLDEN_V2))
    rules = events[0].attributes["redaction"].replace('"version":2', '"version":3')
    events[0] = replace(events[0], attributes={**events[0].attributes, "redaction": rules})
    report = replay_run(events, golden_agent)
    assert not report.passed


def _fresh_scan() -> Any:
    """The version 3 scan of a redactor of its own (nothing remembered yet)."""
    return Redactor()._walk._scan


def test_a_text_scanned_again_gives_what_it_gave_the_first_time() -> None:
    rng = random.Random(33)
    texts = [s.value for s in secret_corpus(4) if isinstance(s.value, str)]
    texts += ["order A-12345 shipped", "x" * 40, "mail bob@example.org now", "\u200bsk-"]
    texts += ["".join(rng.choice("ab1 @.:=%-\n") for _ in range(200)) for _ in range(50)]
    remembered, fresh = _fresh_scan(), _fresh_scan()
    for text in texts:
        first: set[str] = set()
        once = remembered.scan(text, first)
        again: set[str] = set()
        assert remembered.scan(text, again) == once
        assert again == first  # the rules that fired are told again
        alone: set[str] = set()
        assert fresh._scan(text, alone, 0, fresh._shapes) == once
        assert alone == first


def test_an_unchanged_text_comes_back_as_the_callers_own_object() -> None:
    scan = _fresh_scan()
    text = "nothing to see in " + "these words " * 5
    scan.scan(text, set())
    copy = "".join(list(text))  # equal, another object
    assert copy is not text
    assert scan.scan(copy, set()) is copy


def test_the_scan_forgets_past_its_bound_and_skips_long_texts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent_blackbox.outbox import _decoded_scan

    monkeypatch.setattr(_decoded_scan, "_REMEMBERED_CHARS", 1000)
    scan = _fresh_scan()
    for i in range(30):
        scan.scan(f"text number {i} " + "w" * 100, set())
    assert 0 < len(scan._scanned) <= 10
    long = "y" * (_decoded_scan._REMEMBERED_LENGTH + 1)
    scan.scan(long, set())
    assert long not in scan._scanned


_KEYS = [
    "role",
    "content",
    "alice@example.com",
    "bob@example.com",
    "password",
    "api_key",
    "name",
    "value",
    "token",
    "logprob",
    "card",
    "number",
    "exp_month",
    "cvc",
    "amount",
    "Authorization",
    1,
    True,
    2.0,
    "descriptionWithLongName",
]
_VALUES: list[Any] = [
    "Bearer abcdefghijklmnop",
    "alice@example.com",
    4111111111111111,
    "hello there",
    -0.1,
    {"number": "4111 1111 1111 1111", "exp_month": 1},
    ["Authorization", "secret"],
]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_mappings_keys_are_judged_alike_from_the_plan_the_walk_keeps(version: int) -> None:
    """The walk keeps how each mapping's keys were judged (by its keys in order); a
    mapping met again is redacted exactly as a walk meeting it first redacts it: the
    same keys (of the same types), values and rules fired."""
    rng = random.Random(version)
    kept = Redactor.from_config({}, default_version=version)
    mappings = []
    for _ in range(300):
        keys = rng.sample(_KEYS, rng.randint(1, 6))
        mappings.append({key: rng.choice(_VALUES) for key in keys})
    mappings.append({"name": "Authorization", "value": "x"})
    mappings.append({"name": "role", "value": "x"})
    mappings.append({"token": "sk-abcdefghijklmnopqrstuv", "logprob": -0.1})
    for mapping in mappings * 2:  # the second time round, every plan is kept
        fresh = Redactor.from_config({}, default_version=version).redact(mapping)
        again = kept.redact(mapping)
        assert again == fresh
        assert [type(k) for k in again.value] == [type(k) for k in fresh.value]
