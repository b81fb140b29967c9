"""Redaction of recorded values, without a database."""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agent_blackbox.outbox._detectors import combine
from agent_blackbox.outbox._redaction import (
    ALWAYS_ON,
    ALWAYS_ON_V2,
    CREDENTIAL_KEYS,
    DEFAULT_DETECTORS,
    DETECTORS,
    PLACEHOLDER_PREFIX,
    SHAPES,
    Redacted,
    RedactionConfigError,
    Redactor,
    placeholder,
)
from agent_blackbox.schemas import BlackboxError

EMAIL = placeholder("email")
PHONE = placeholder("phone")
CARD = placeholder("card_number")
BEARER = placeholder("bearer_token")
API_KEY = placeholder("api_key")
CREDENTIAL = placeholder("credential")
PATH = placeholder("path")

REDACTOR = Redactor()


def redact(value: Any) -> Any:
    return REDACTOR.redact(value).value


def test_placeholders_are_typed() -> None:
    assert placeholder("email") == "[redacted:email]"
    assert EMAIL.startswith(PLACEHOLDER_PREFIX)
    assert set(DEFAULT_DETECTORS) == set(DETECTORS)
    assert set(ALWAYS_ON) <= set(DETECTORS)


# --- detectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail me at a@b.io now", f"mail me at {EMAIL} now"),
        ("Jane.Doe+tickets@mail.example.co.uk", EMAIL),
        ("<ops@example.com>, dev@example.org.", f"<{EMAIL}>, {EMAIL}."),
    ],
)
def test_email_is_replaced_and_the_text_around_it_kept(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", ["no at sign here", "user@localhost", "@handle on social", "a@b"])
def test_email_lookalikes_are_kept(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "+44 20 7946 0958",
        "+15551234567",
        "+1 (555) 123-4567",
        "+33 1 23 45 67 89",
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "020 7946 0958",
        "06 12 34 56 78",
        "07700 900123",
        "030 12345678",
    ],
)
def test_phone_numbers_are_replaced(text: str) -> None:
    assert redact(f"call {text} today") == f"call {PHONE} today"


@pytest.mark.parametrize(
    "text",
    [
        "on 2026-12-02",
        "on 02.12.2026",
        "at 2026-12-02T10:11:12Z",
        "at 2026-12-02 10:11:12",
        "python 3.11.4",
        "build 10.0.19041.1",
        "host 192.168.10.20",
        "order 1234567",
        "ticket 4521 of 12345",
        "pi is 3.14159265",
        "price 1234.567",
        "uuid 123e4567-e89b-12d3-a456-426614174000",
        "+12345",
        "scores 10 20 30 40",
        "totals 100 200 300",
        "1111 1111 1111",
        "ratio 1234.5678",
    ],
)
def test_dates_versions_and_plain_numbers_are_not_phones(text: str) -> None:
    assert REDACTOR.redact(text) == Redacted(text, ())


@pytest.mark.parametrize(
    "text",
    ["4111 1111 1111 1111", "4111-1111-1111-1111", "4111111111111111", "378282246310005"],
)
def test_luhn_valid_card_numbers_are_replaced(text: str) -> None:
    assert REDACTOR.redact(f"card {text}, thanks") == Redacted(
        f"card {CARD}, thanks", ("card_number",)
    )


@pytest.mark.parametrize(
    "text",
    ["4111 1111 1111 1112", "4111111111111112", "0000 0000 0000 0000", "12345678901234567890"],
)
def test_card_lookalikes_failing_luhn_are_kept(text: str) -> None:
    assert redact(text) == text


def test_integer_card_numbers_are_replaced_whole() -> None:
    # Version 3: where a card number is expected (a card-like key); version 2: anywhere.
    assert REDACTOR.redact({"card": 4111111111111111}) == Redacted({"card": CARD}, ("card_number",))
    assert REDACTOR.redact({"n": 4111111111111111}).value == {"n": 4111111111111111}
    assert Redactor(version=2).redact({"n": 4111111111111111}).value == {"n": CARD}
    assert redact([4111111111111112, 42, -4111111111111111, True, 1.5, None]) == [
        4111111111111112,
        42,
        -4111111111111111,
        True,
        1.5,
        None,
    ]


def test_integer_cards_are_kept_when_the_detector_is_off() -> None:
    assert Redactor(detectors=["email"]).redact(4111111111111111).value == 4111111111111111


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer abc123.def-456_ghi",
        "authorization: bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
        "BEARER ABCDEFGH12345678",
        "Authorization: bEaReR Zm9vYmFyMTIz",
        "Basic dXNlcjpwYXNz",
        "basic YWRtaW46YWRtaW4=",
    ],
)
def test_bearer_and_basic_credentials_are_replaced(text: str) -> None:
    result = REDACTOR.redact(text)
    assert BEARER in result.value
    assert result.fired == ("bearer_token",)
    assert "abc123" not in result.value
    assert "dXNlcjpwYXNz" not in result.value


@pytest.mark.parametrize(
    "text",
    ["Basic Authentication is basic", "the bearer of bad news", "Bearer tokens expire", "basic"],
)
def test_prose_about_bearers_is_kept(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    "key",
    [
        "sk-abcdefghijklmnopqrstuvwx1234",
        "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1w",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "gho_abcdefghijklmnopqrstuvwxyz0123456789",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "xoxb-1234567890-abcdefghij",
        "AIzaSyA-abcdefghijklmnopqrstuvwxyz12345",
    ],
)
def test_well_known_key_shapes_are_replaced(key: str) -> None:
    assert REDACTOR.redact(f"key={key};") == Redacted(f"key={API_KEY};", ("api_key",))


@pytest.mark.parametrize(
    "text",
    ["task-abcdefghijklmnopqrstuvwxyz", "sk-short", "AKIA-not-a-key", "ghp_short", "risk-free"],
)
def test_key_lookalikes_are_kept(text: str) -> None:
    assert redact(text) == text


def test_every_combination_of_detectors_compiles() -> None:
    # A string's hints pick which detectors run, so any subset may be combined.
    names = tuple(DETECTORS)
    for size in range(1, len(names) + 1):
        for subset in itertools.combinations(names, size):
            assert combine(subset).groupindex.keys() == set(subset)


def test_short_strings_are_kept_untouched() -> None:
    for text in ["", "a", "step", "12345", "a@b.c"]:
        assert REDACTOR.redact(text) == Redacted(text, ())


def test_configured_detectors_only_and_always_on_ones_regardless() -> None:
    text = "a@b.io, +44 20 7946 0958, Bearer abc123def456, sk-abcdefghijklmnopqrstuvwx1234"
    only_email = Redactor(detectors=["email"]).redact(text)
    assert only_email.value == f"{EMAIL}, +44 20 7946 0958, {BEARER}, {API_KEY}"
    assert only_email.fired == ("api_key", "bearer_token", "email")
    none = Redactor(detectors=[]).redact(text)
    assert none.value == f"a@b.io, +44 20 7946 0958, {BEARER}, {API_KEY}"


# --- credentials -------------------------------------------------------------------------


def test_credential_keys_are_replaced_whole_at_any_depth() -> None:
    value = {
        "kwargs": {
            "url": "https://api.example.com",
            "headers": {"Authorization": "token-1", "X-Api-Key": 12345, "Accept": "json"},
            "auth": {"PASSWORD": ["hunter2"], "Set Cookie": {"sid": "1", "csrf": "2"}},
        },
        "args": [{"client_secret": None}],
    }
    result = REDACTOR.redact(value)
    assert result.value == {
        "kwargs": {
            "url": "https://api.example.com",
            "headers": {"Authorization": CREDENTIAL, "X-Api-Key": CREDENTIAL, "Accept": "json"},
            "auth": CREDENTIAL,  # "auth" names a credential since version 2
        },
        "args": [{"client_secret": CREDENTIAL}],
    }
    assert result.fired == ("credential",)
    # Version 1 (runs recorded before versions existed) kept "auth" and looked inside.
    old = Redactor(version=1).redact(value).value
    assert old["kwargs"]["auth"] == {"PASSWORD": CREDENTIAL, "Set Cookie": CREDENTIAL}


def test_credential_key_set_is_normalised() -> None:
    for key in CREDENTIAL_KEYS:
        assert key == key.lower()
        assert "-" not in key
        assert " " not in key
    assert "token" not in CREDENTIAL_KEYS  # LLM logprobs carry {"token": ...}


def test_header_lists_lose_credential_values_and_keep_the_rest() -> None:
    headers = [
        ["Authorization", "Basic dXNlcjpwYXNz"],
        ("content-type", "application/json"),
        {"name": "Cookie", "value": "sid=abc"},
        {"name": "Accept", "value": "text/plain"},
    ]
    assert redact({"headers": headers}) == {
        "headers": [
            ["Authorization", CREDENTIAL],
            ["content-type", "application/json"],
            {"name": "Cookie", "value": CREDENTIAL},
            {"name": "Accept", "value": "text/plain"},
        ]
    }
    # The secret is replaced whole, so only the credential rule fires.
    assert REDACTOR.redact(headers).fired == ("credential",)


def test_credentials_survive_a_configuration_that_disables_everything() -> None:
    bare = Redactor(detectors=[], paths=[])
    value = {
        "api_key": "anything",
        "headers": [["proxy-authorization", "x"]],
        "note": "Bearer abc123def456 and sk-abcdefghijklmnopqrstuvwx1234",
    }
    assert bare.redact(value).value == {
        "api_key": CREDENTIAL,
        "headers": [["proxy-authorization", CREDENTIAL]],
        "note": f"{BEARER} and {API_KEY}",
    }
    assert bare.rules == (
        "api_key",
        "bearer_token",
        "credential",
        "credential_pair",
        "private_key",
        "url_userinfo",
    )
    assert Redactor.from_config({"detectors": [], "paths": []}).rules == bare.rules
    old = Redactor(detectors=[], version=1)
    assert old.rules == ("api_key", "bearer_token", "credential")
    assert Redactor.from_config({"detectors": []}, default_version=1).rules == old.rules


# --- paths -------------------------------------------------------------------------------


def test_paths_with_wildcards_replace_whole_values() -> None:
    redactor = Redactor(
        detectors=[], paths=["kwargs.customer.ssn", "args.*.email", "messages.*.content"]
    )
    value = {
        "args": [{"email": "x", "id": 1}, {"email": {"nested": True}}, "plain"],
        "kwargs": {"customer": {"ssn": "078-05-1120", "name": "Ann"}, "ssn": "kept"},
        "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": ["a"]}],
    }
    result = redactor.redact(value)
    assert result.value == {
        "args": [{"email": PATH, "id": 1}, {"email": PATH}, "plain"],
        "kwargs": {"customer": {"ssn": PATH, "name": "Ann"}, "ssn": "kept"},
        "messages": [{"role": "user", "content": PATH}, {"role": "tool", "content": PATH}],
    }
    assert result.fired == (
        "path:args.*.email",
        "path:kwargs.customer.ssn",
        "path:messages.*.content",
    )


def test_path_segments_match_list_indexes_and_any_key() -> None:
    redactor = Redactor(detectors=[], paths=["args.1", "*.hidden"])
    value = {"args": ["a", "b", "c"], "x": {"hidden": 1}, "y": {"hidden": 2, "z": 3}}
    assert redactor.redact(value).value == {
        "args": ["a", PATH, "c"],
        "x": {"hidden": PATH},
        "y": {"hidden": PATH, "z": 3},
    }


def test_paths_that_do_not_match_fire_nothing() -> None:
    redactor = Redactor(detectors=[], paths=["kwargs.customer.ssn"])
    assert redactor.redact({"kwargs": {"customer": "Ann"}}) == Redacted(
        {"kwargs": {"customer": "Ann"}}, ()
    )


def test_rules_name_everything_in_force() -> None:
    redactor = Redactor(detectors=["phone", "email"], paths=["b.c", "a", "b.c"])
    assert redactor.rules == (
        "api_key",
        "bearer_token",
        "credential",
        "credential_pair",
        "email",
        "path:a",
        "path:b.c",
        "phone",
        "private_key",
        "url_userinfo",
    )
    assert REDACTOR.rules == tuple(sorted((*SHAPES, "credential")))
    assert Redactor(version=1).rules == tuple(sorted((*DETECTORS, "credential")))


def test_fired_is_sorted_and_unique() -> None:
    redactor = Redactor(paths=["z"])
    value = {
        "z": 1,
        "b": "a@b.io c@d.io",
        "a": ["a@b.io", {"cc": 4111111111111111}],
        "password": "p",
    }
    assert redactor.redact(value).fired == ("card_number", "credential", "email", "path:z")


# --- purity ------------------------------------------------------------------------------


def test_the_input_is_not_mutated_and_the_output_is_a_copy() -> None:
    value = {"a": [{"email": "a@b.io"}, ("x", "b@c.io")], "password": "p", "n": 1}
    before = copy.deepcopy(value)
    result = Redactor(paths=["n"]).redact(value)
    assert value == before
    assert result.value == {
        "a": [{"email": EMAIL}, ["x", EMAIL]],
        "password": CREDENTIAL,
        "n": PATH,
    }
    clean = {"a": [{"b": 1}], "c": ("d",)}
    copied = REDACTOR.redact(clean).value
    assert copied == {"a": [{"b": 1}], "c": ["d"]}
    assert copied is not clean
    assert copied["a"] is not clean["a"]
    assert copied["a"][0] is not clean["a"][0]


def test_non_string_keys_are_left_as_they_are() -> None:
    value = {1: "a@b.io", None: "x", (2, 3): {"password": "p"}, 1.5: ["Authorization", "y"]}
    assert redact(value) == {
        1: EMAIL,
        None: "x",
        (2, 3): {"password": CREDENTIAL},
        1.5: ["Authorization", CREDENTIAL],
    }
    assert Redactor(paths=["*"]).redact({1: "a"}).value == {1: PATH}
    assert Redactor(paths=["1"]).redact({1: "a"}).value == {1: "a"}


def test_equal_inputs_give_equal_outputs_whatever_the_order() -> None:
    one = {"a": "a@b.io", "b": {"password": 1, "c": [1, 2]}, "d": "+44 20 7946 0958"}
    two = {"d": "+44 20 7946 0958", "b": {"c": [1, 2], "password": 1}, "a": "a@b.io"}
    forward = Redactor(detectors=["email", "phone"], paths=["b.c", "a"])
    backward = Redactor(detectors=["phone", "email"], paths=["a", "b.c"])
    results = [r.redact(v) for r in (forward, backward) for v in (one, two)]
    assert all(result == results[0] for result in results)
    assert json.dumps(results[0].value, sort_keys=True) == json.dumps(
        results[3].value, sort_keys=True
    )


def test_placeholders_are_left_alone() -> None:
    placeholders = [placeholder(rule) for rule in (*DETECTORS, "credential", "path")]
    for text in placeholders:
        assert REDACTOR.redact(text) == Redacted(text, ())
    joined = " ".join(placeholders)
    assert REDACTOR.redact(joined) == Redacted(joined, ())


FRAGMENTS = (
    "a@b.io",
    "Jane.Doe@mail.example.com",
    "+44 20 7946 0958",
    "(555) 123-4567",
    "555-123-4567",
    "4111 1111 1111 1111",
    "4111111111111112",
    "378282246310005",
    "2026-12-02",
    "3.11.4",
    "192.168.1.1",
    "Bearer abc123def456",
    "Basic Authentication",
    "sk-abcdefghijklmnopqrstuvwx1234",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "[redacted:email]",
    "hello",
    "1234",
    "77",
    "x",
)
SEPARATORS = ("", " ", "-", ".", "+", "@", ",", ":", "(", ")", "_", "\n")


def _sample(rng: random.Random) -> Any:
    text = "".join(rng.choice(FRAGMENTS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 6)))
    shape = rng.randrange(4)
    if shape == 0:
        return text
    if shape == 1:
        return {"k": text, "password": text, "n": rng.choice([4111111111111111, 7, True])}
    if shape == 2:
        return [["Authorization", text], {"name": "x", "value": text}, (text,)]
    return {"messages": [{"role": "user", "content": text}], "args": [text, None]}


def test_redacting_twice_is_redacting_once() -> None:
    rng = random.Random(20261202)
    redactor = Redactor(paths=["messages.*.content"])
    for _ in range(3000):
        value = _sample(rng)
        once = redactor.redact(value)
        twice = redactor.redact(once.value)
        assert twice.value == once.value, value
        assert redactor.redact(copy.deepcopy(value)) == once
        assert set(twice.fired) <= set(once.fired), value


def test_adversarial_strings_take_linear_time() -> None:
    # Patterns that backtrack would take minutes on these; linear ones take milliseconds.
    strings = ["1 " * 50_000 + "a", "(11)" * 25_000 + "a", "a." * 50_000 + "@", "11-" * 40_000]
    strings += ["a@" + "b." * 50_000 + "1", "Bearer " + "a" * 100_000 + ".", "4" * 100_000]
    started = time.perf_counter()
    for text in strings:
        REDACTOR.redact(text)
    assert time.perf_counter() - started < 5


# --- configuration -----------------------------------------------------------------------


def test_from_config_builds_the_configured_redactor() -> None:
    config = {"detectors": ["email"], "paths": ["args.0"]}
    redactor = Redactor.from_config(config, default_version=1)
    assert redactor.rules == ("api_key", "bearer_token", "credential", "email", "path:args.0")
    assert Redactor.from_config({}).rules == REDACTOR.rules
    assert Redactor.from_config(config).config == {**config, "version": 3} | {
        "detectors": [*ALWAYS_ON_V2, "email"]
    }


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"detectors": ["email", "ssn"]}, "'ssn'"),
        ({"paths": ["a..b"]}, "'a..b'"),
        ({"paths": [""]}, "''"),
        ({"paths": ["a.b*"]}, "'a.b*'"),
        ({"paths": ["a. b"]}, "'a. b'"),
        ({"detector": ["email"]}, "'detector'"),
        ({"detectors": "email"}, "'detectors'"),
        ({"paths": [1]}, "'paths'"),
    ],
)
def test_from_config_names_the_bad_item(config: dict[str, Any], named: str) -> None:
    with pytest.raises(RedactionConfigError, match=re.escape(named)):
        Redactor.from_config(config)


def test_the_constructor_validates_too() -> None:
    with pytest.raises(RedactionConfigError, match="'phones'"):
        Redactor(detectors=["phones"])
    with pytest.raises(RedactionConfigError, match="malformed"):
        Redactor(paths=["kwargs."])
    with pytest.raises(RedactionConfigError, match="not a string"):
        Redactor(detectors="email")
    assert issubclass(RedactionConfigError, BlackboxError)


def test_from_file_reads_a_json_config(tmp_path: Path) -> None:
    path = tmp_path / "redaction.json"
    path.write_text(json.dumps({"detectors": ["phone"], "paths": ["kwargs.ssn"]}))
    redactor = Redactor.from_file(path)
    assert redactor.redact({"kwargs": {"ssn": 1}, "a": "a@b.io"}).value == {
        "kwargs": {"ssn": PATH},
        "a": "a@b.io",
    }


def test_from_file_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(RedactionConfigError, match=r"missing\.json") as raised:
        Redactor.from_file(missing)
    assert "create it" in str(raised.value)

    broken = tmp_path / "broken.json"
    broken.write_text('{"detectors": [')
    with pytest.raises(RedactionConfigError, match=r"broken\.json.*not valid JSON"):
        Redactor.from_file(broken)

    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"detectors": ["email", "passport"]}')
    with pytest.raises(RedactionConfigError, match=r"unknown\.json.*'passport'"):
        Redactor.from_file(unknown)

    listed = tmp_path / "listed.json"
    listed.write_text('["email"]')
    with pytest.raises(RedactionConfigError, match=r"listed\.json.*must be an object"):
        Redactor.from_file(listed)


def test_a_bare_json_web_token_is_an_api_key_whatever_the_configuration() -> None:
    token = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.Q29va2llU2lnbmF0dXJl"
    redacted = Redactor(detectors=[], paths=[]).redact({"content": f"my token is {token}."})
    assert redacted.value == {"content": "my token is [redacted:api_key]."}
    assert redacted.fired == ("api_key",)


@pytest.mark.parametrize(
    "value",
    [4, 2.5, None, True, "short", [1, "ab", None], (3, 4), "x" * 5],
)
def test_inert_values_are_the_ones_redaction_leaves_alone(value: Any) -> None:
    redactor = Redactor()
    assert redactor.inert(value)
    assert redactor.redact(value).fired == ()


@pytest.mark.parametrize(
    "value",
    ["a@b.io", {"k": 1}, ["cookie", "x"], [["a", "a@b.io"]]],
)
def test_values_a_rule_may_touch_are_not_inert(value: Any) -> None:
    assert not Redactor().inert(value)
    assert not Redactor(detectors=[], paths=["x"]).inert(1)
    # An integer alone is a card number up to version 2 only (version 3 needs a key).
    assert not Redactor(version=2).inert(4111111111111111)
    assert Redactor().inert(4111111111111111)
