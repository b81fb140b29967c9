"""The run list's search query: terms become filter values, words a full-text query,
and anything else a clear error; nothing typed ever becomes SQL."""

from __future__ import annotations

import random

import pytest

from agent_blackbox.consumers import (
    RunFilter,
    SearchError,
    parse_search,
    with_search,
)
from agent_blackbox.consumers._search import (
    bitmap_terms,
    loose_words,
    run_prefix_range,
    search_clauses,
)


def test_terms_become_filters_and_words_a_text_query() -> None:
    terms = parse_search(
        'model:gpt-4o-mini tool:lookup status:failed "refund loop" late '
        "tag:team=billing tag:beta run:3f2a code:v1.4 prompt:v2 error:TimeoutError "
        "session:chat-1 user:u-42 agent:support"
    )
    assert terms.filters == {
        "model": "gpt-4o-mini",
        "tool": "lookup",
        "status": "failed",
        "tags": (("team", "billing"), ("beta", None)),
        "run_prefix": "3f2a",
        "code_version": "v1.4",
        "prompt_version": "v2",
        "error_class": "TimeoutError",
        "session": "chat-1",
        "user": "u-42",
        "agent": "support",
    }
    assert terms.words == '"refund loop" late'


def test_quoted_values_keep_their_spaces_and_names_are_case_blind() -> None:
    terms = parse_search('Session:"chat with spaces" MODEL:m')
    assert terms.filters == {"session": "chat with spaces", "model": "m"}
    assert terms.words is None


def test_an_empty_query_asks_for_nothing() -> None:
    assert parse_search("   ") == parse_search("")
    assert parse_search("").filters == {}
    assert parse_search("").words is None


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("colour:red", "colour: is not a search term"),
        ("tool:", "tool: needs a value"),
        ('model:"gpt', "a quote is not closed"),
        ("status:exploded", "status:exploded is not a run status"),
        ("model:a model:b", "model: is given twice"),
        ("run:abc%", "is not the start of a run id"),
        ("run:x'; DROP TABLE runs; --", "is not the start of a run id"),
        ("tag:Team=x", "a tag name is lower-case"),
        ("tool:a\x1b[31m", "control or invisible character"),
        ("x" * 501, "keep it to 500"),
        ("model:" + "m" * 201, "longer than 200 characters"),
    ],
)
def test_hostile_or_malformed_queries_are_clear_errors(query: str, says: str) -> None:
    with pytest.raises(SearchError, match=None) as raised:
        parse_search(query)
    assert says in str(raised.value)
    assert isinstance(raised.value, ValueError)  # a bad input, to every caller


def test_sql_in_a_value_stays_a_value() -> None:
    hostile = "x' OR '1'='1"
    where = with_search(RunFilter(), parse_search(f'model:"{hostile}" "{hostile}"'))
    params: dict[str, object] = {}
    clauses = search_clauses(where, params, "r", "u")
    assert where.model == hostile
    assert params["words"] == f'"{hostile}"'
    assert all(hostile not in clause for clause in clauses)  # bound, never spliced


def test_search_replaces_filters_of_the_same_name_and_adds_tags() -> None:
    where = RunFilter(model="a", tags=(("team", "x"),), agent="kept")
    narrowed = with_search(where, parse_search("model:b tag:beta words"))
    assert narrowed.model == "b"
    assert narrowed.agent == "kept"
    assert narrowed.tags == (("team", "x"), ("beta", None))
    assert narrowed.text == "words"


def test_a_run_prefix_is_a_byte_range() -> None:
    assert run_prefix_range("3f2a") == ("3f2a", "3f2b")
    assert run_prefix_range("run-9") == ("run-9", "run-:")
    low, high = run_prefix_range("ab")
    assert low <= "ab" < "ab-zz" < "abz" < high
    assert not (low <= "ac" < high)


@pytest.mark.parametrize(
    ("words", "loose"),
    [
        ('"refund order" late', "refund order late"),
        ("refund -invoice", "refund"),
        ("-invoice", ""),
        ("refund or invoice", "refund or invoice"),
        ("or", ""),
    ],
)
def test_a_runs_words_are_searched_for_what_any_matching_call_implies(
    words: str, loose: str
) -> None:
    assert loose_words(words) == loose


def test_terms_in_the_rollups_indexes_are_counted_for_the_bitmaps() -> None:
    assert bitmap_terms(RunFilter()) == 0
    assert bitmap_terms(RunFilter(model="m", agent="a", session="s")) == 1
    where = with_search(RunFilter(), parse_search("tool:t error:E tag:a=b tag:c words"))
    assert bitmap_terms(where) == 5


def test_any_typed_text_parses_or_is_a_search_error() -> None:
    draw = random.Random(29)
    alphabet = "ab:=\" -_tolgrunsx'%;\\"
    for _ in range(3000):
        typed = "".join(draw.choice(alphabet) for _ in range(draw.randint(0, 40)))
        try:
            terms = parse_search(typed)
        except SearchError:
            continue
        with_search(RunFilter(), terms)  # whatever parsed is a filter
