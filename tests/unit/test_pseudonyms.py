"""Deterministic pseudonyms for redacted values: keyed, stable per value within a tenant,
opt-in per rule, and refused without a key store."""

from __future__ import annotations

import json
import re

import pytest

from agent_blackbox.outbox import MemoryRecorder, RedactionConfigError, Redactor
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.outbox.contract import Contract
from agent_blackbox.schemas import KeyedDigest, digest

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
PSEUDONYM = re.compile(r"\[email:[0-9a-f]{12}\]")

REDACTOR = Redactor(pseudonyms=["email"]).keyed(KEY)


def redact(value: object, redactor: Redactor = REDACTOR) -> object:
    return redactor.redact(value).value


def test_the_same_value_gets_the_same_pseudonym_and_others_differ() -> None:
    out = redact({"billing": "ann@example.com", "contact": "ann@example.com", "x": "bob@ex.io"})
    assert isinstance(out, dict)
    assert PSEUDONYM.fullmatch(out["billing"])
    assert out["billing"] == out["contact"]
    assert out["billing"] != out["x"]
    assert "ann" not in json.dumps(out)


def test_pseudonyms_stand_inside_text_and_other_rules_keep_their_placeholders() -> None:
    out = redact("write to ann@example.com or call +44 20 7946 0958")
    assert isinstance(out, str)
    mail = redact("ann@example.com")
    assert out == f"write to {mail} or call [redacted:phone]"


def test_pseudonyms_are_keyed() -> None:
    other = Redactor(pseudonyms=["email"]).keyed(OTHER_KEY)
    assert redact("ann@example.com") != redact("ann@example.com", other)
    # Case is kept: code comparing the raw strings would have told these apart.
    assert redact("Ann@example.com") != redact("ann@example.com")


def test_a_text_remembered_under_one_key_is_redacted_afresh_under_another() -> None:
    text = "mail ann@example.com about the refund"
    rules = Redactor(pseudonyms=["email"])
    first, second = rules.keyed(KEY), rules.keyed(OTHER_KEY)
    assert redact(text, first) == redact(text, first)  # the second time from memory
    assert redact(text, second) != redact(text, first)
    assert redact(text, second) == redact(text, Redactor(pseudonyms=["email"]).keyed(OTHER_KEY))


def test_redacting_a_pseudonym_again_changes_nothing() -> None:
    value = {"a": "ann@example.com", "card": 4111111111111111, "text": "bob@ex.io and x"}
    redactor = Redactor(pseudonyms=["email", "card_number"]).keyed(KEY)
    once = redact(value, redactor)
    assert redact(once, redactor) == once
    assert isinstance(once, dict)
    assert re.fullmatch(r"\[card_number:[0-9a-f]{12}\]", once["card"])


def test_path_rules_can_give_pseudonyms_of_the_whole_value() -> None:
    redactor = Redactor(paths=["kwargs.customer"], pseudonyms=["path"]).keyed(KEY)
    same = {"kwargs": {"customer": {"id": 7, "name": "Ann"}}}
    first, second = redact(same, redactor), redact(json.loads(json.dumps(same)), redactor)
    assert first == second
    other = redact({"kwargs": {"customer": {"id": 8, "name": "Ann"}}}, redactor)
    assert first != other
    assert isinstance(first, dict)
    assert re.fullmatch(r"\[path:[0-9a-f]{12}\]", first["kwargs"]["customer"])


def test_without_a_key_a_pseudonymous_redactor_refuses_to_redact() -> None:
    unkeyed = Redactor(pseudonyms=["email"])
    assert unkeyed.redact("no address here at all").value == "no address here at all"
    with pytest.raises(RedactionConfigError, match="dictionary attack"):
        unkeyed.redact("ann@example.com")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"pseudonyms": ["credential"]}, "not offered"),
        ({"pseudonyms": ["api_key"]}, "not offered"),
        ({"detectors": ["phone"], "pseudonyms": ["email"]}, "its detector is off"),
        ({"pseudonyms": ["path"]}, "no path rule is configured"),
        ({"pseudonyms": "email"}, "list of strings"),
    ],
)
def test_bad_pseudonym_rules_are_refused(config: dict[str, object], message: str) -> None:
    with pytest.raises(RedactionConfigError, match=message):
        Redactor.from_config(config)


def test_the_rules_round_trip_and_rules_without_pseudonyms_read_as_before() -> None:
    detectors = list(Redactor().config["detectors"])
    assert Redactor().config == {"detectors": detectors, "paths": [], "version": 3}
    old = Redactor(version=1).config
    assert old == {"detectors": list(old["detectors"]), "paths": []}
    assert "pseudonyms" not in Redactor().config
    rules = Redactor(pseudonyms=["phone", "email"]).config
    assert rules["pseudonyms"] == ["email", "phone"]
    assert Redactor.from_config(rules).config == rules


def test_a_run_keys_its_pseudonyms_with_the_tenants_key() -> None:
    rules = Scrub(Redactor(pseudonyms=["email"]))
    tenant_a, tenant_b = KeyedDigest(KEY), KeyedDigest(OTHER_KEY)
    one, two = Contract(rules, tenant_a), Contract(rules, tenant_a)
    fired: set[str] = set()
    mail = one.scrub.value("ann@example.com", fired)
    assert fired == {"email"}
    assert PSEUDONYM.fullmatch(mail)
    assert two.scrub.value("ann@example.com", set()) == mail  # stable across runs
    assert Contract(rules, tenant_b).scrub.value("ann@example.com", set()) != mail
    # The same input gives the same digest in record and in replay.
    assert one.tool("t", ("ann@example.com",), {}) == two.tool("t", ("ann@example.com",), {})


def test_a_run_without_a_tenant_key_cannot_take_pseudonyms() -> None:
    with pytest.raises(RedactionConfigError, match="no tenant key"):
        Contract(Scrub(Redactor(pseudonyms=["email"])), digest)


def test_a_recorder_without_a_key_store_says_pseudonyms_need_one() -> None:
    with pytest.raises(RedactionConfigError, match=r"key store.*dictionary attack"):
        MemoryRecorder(redaction=Redactor(pseudonyms=["email"]))
